"""The tracker worker: `python -m nightlab.trackers LAB_DIR [CONFIG_DIGEST]`.

The controller keeps it running while `[trackers]` is configured (`fleet.sidecar`), restarts
it when the section changes (the digest argument is only that trigger), and stops it with
itself. One thread per tracker follows the ledger (`_outbox.follow`); the main thread only
waits, so a SIGTERM, or the controller's death (this process's parent changes), ends the worker
at once even while a tracker call hangs: the batch in flight is sent again by the next worker.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path

JOIN_SECONDS = 5.0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m nightlab.trackers LAB_DIR", file=sys.stderr)
        return 2
    lab_dir = Path(args[0]).resolve()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("WANDB_SILENT", "true")
    from nightlab.config import load_lab_config
    from nightlab.trackers._base import TRACKERS, make_tracker
    from nightlab.trackers._outbox import follow

    config = load_lab_config(lab_dir).config
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threads = []
    for name in TRACKERS:
        section = getattr(config.trackers, name)
        if section is None:
            continue
        thread = threading.Thread(
            target=follow,
            args=(lab_dir, config, lambda n=name: make_tracker(n, config, lab_dir), section.key, stop),
            name=f"tracker-{name}",
            daemon=True,
        )
        thread.start()
        threads.append(thread)
    logging.getLogger("nightlab.trackers").info(
        "following %s for %s", ", ".join(t.name for t in threads) or "nothing", lab_dir
    )
    parent = os.getppid()
    while not stop.wait(1.0):
        if os.getppid() != parent:  # the controller died: so does its worker
            stop.set()
    for thread in threads:
        thread.join(JOIN_SECONDS)
    sys.stdout.flush()
    sys.stderr.flush()
    # a thread stuck in a tracker call must not hold the exit, nor the libraries' exit hooks wait on it
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
