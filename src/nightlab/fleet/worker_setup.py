"""What a worker cluster's set-up runs: `python -m nightlab.fleet.worker_setup prepare`.

The lab synced to a cluster has no `.nightlab/` (git-ignored), so `nightlab prepare` cannot open
it there; the set-up step of `fleet/templates/worker.yaml` calls this instead, with the synced lab
as its working directory. Runs on the worker, never on the controller.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from nightlab.fleet.sky_task import REMOTE_VAL_SECRET


def prepare_worker(lab_dir: Path) -> Path | None:
    """Prepare the lab's data on a worker cluster from its `nightlab.toml` alone.

    The lab synced to a cluster has no `.nightlab/` (it is git-ignored), so `nightlab
    prepare` cannot open it there; set-up calls this instead. The data directory is keyed
    by the profile's fingerprint, the same one the controller checks on every result.
    The lab's validation secret (`REMOTE_VAL_SECRET`, mounted by `cluster_task`) is moved into
    it: a folder prepared with another secret has its validation split made again.

    Returns:
        The data directory, or None for a foreign target (which prepares its own data).
    """
    from nightlab.config import load_lab_config
    from nightlab.harness.data import prepare
    from nightlab.harness.profiles import Profile

    config = load_lab_config(lab_dir).config
    if not config.profile:
        return None
    mounted = Path(os.path.expanduser(REMOTE_VAL_SECRET))
    secret = mounted.read_bytes() if mounted.is_file() else None
    try:
        return prepare(Profile.from_dict(config.profile), progress=False, val_secret=secret)
    finally:
        mounted.unlink(missing_ok=True)  # outside the data folder a run could read it


def main(argv: list[str] | None = None) -> None:
    """`prepare`: the lab's data in this worker's data directory (prints it)."""
    if (sys.argv[1:] if argv is None else argv) != ["prepare"]:
        sys.exit("usage: python -m nightlab.fleet.worker_setup prepare")
    print(prepare_worker(Path.cwd()) or "foreign target: nothing to prepare")


if __name__ == "__main__":
    main()
