"""A helper process the controller keeps running beside itself (the experiment trackers' worker).

The controller is handed `argv_for(config)`: the command line that should run under the config
in force, or None for none (`fleet.daemon` wires the trackers' worker in; the fleet imports
nothing of it). Each heartbeat `sync` starts it, restarts it when it exited (at most once per
`RESTART_SECONDS`, so a worker that dies at start costs nothing), replaces it when the command
line changes (a re-committed nightlab.toml), and `stop` ends it with the controller. The helper
reads the ledger itself: nothing here waits on it, so it cannot delay a dispatch.
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("nightlab.controller")

RESTART_SECONDS = 30.0
STOP_SECONDS = 5.0  # SIGTERM, then SIGKILL after this long


class Sidecar:
    """Keeps `argv_for(config)` running; its output is appended to `log_path`."""

    def __init__(self, argv_for: Callable[[Any], Sequence[str] | None], log_path: Path) -> None:
        self.argv_for, self.log_path = argv_for, log_path
        self.argv: list[str] | None = None
        self.proc: subprocess.Popen | None = None
        self._started = 0.0

    def sync(self, config: Any) -> None:
        argv = self.argv_for(config)
        wanted = list(argv) if argv is not None else None
        if wanted != self.argv:
            self.stop()
            self.argv, self._started = wanted, 0.0
        if self.argv is None or (self.proc is not None and self.proc.poll() is None):
            return
        now = time.time()
        if now - self._started < RESTART_SECONDS:
            return
        if self.proc is not None:
            log.warning("%s exited (code %s); restarting it", self.argv[2:4], self.proc.returncode)
        self._started = now
        try:
            with open(self.log_path, "ab") as out:
                self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        except OSError as e:  # a full disk, a vanished interpreter: the fleet goes on without it
            log.error("cannot start %s: %s", self.argv[2:4], e)
            self.proc = None

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
