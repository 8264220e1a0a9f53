"""A full disk is the machine's fault, not the code's: the controller's two rules for it.

- a run that ended without a result while the disk holding its folder was full (or its log says
  so) could not write its log: it ends `infra` and is retried when there is room (`disk_full`,
  `disk_full_detail`);
- while the lab's own disk is that full, nothing is leased: a run started then would die writing
  its log (`DiskGate`), and waits in the queue for space.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from nightlab.ledger.integrity import free_bytes

# the controller's logger: these lines are the dispatch loop's, whoever writes them
log = logging.getLogger("nightlab.controller")

LOW_DISK_BYTES = 1 << 20  # below 1 MiB free a log write can fail: such a crash is the disk's, not the code's


def disk_full(run_dir: Path, tail: str) -> bool:
    """Whether a run that ended without a result was stopped by a full disk."""
    free = free_bytes(run_dir)
    return (free is not None and free < LOW_DISK_BYTES) or "No space left on device" in tail[-4096:]


def disk_full_detail(run_dir: Path) -> str:
    """The end's detail for a run a full disk stopped: where, how much is free, and the fix."""
    free = free_bytes(run_dir)
    return (
        f"the disk holding `{run_dir}` filled up while the run wrote its log "
        f"({(free or 0) / 2**20:.1f} MiB free); free some space (`nightlab doctor` checks it)"
    )


class DiskGate:
    """Whether the lab's disk is too full to start a run, warning at most once a minute."""

    def __init__(self, lab_dir: Path) -> None:
        self.path = lab_dir / ".nightlab"
        self._warned = 0.0

    def full(self) -> bool:
        """True while the lab's `.nightlab` folder has less than `LOW_DISK_BYTES` free."""
        free = free_bytes(self.path)
        full = free is not None and free < LOW_DISK_BYTES
        now = time.time()
        if full and now - self._warned > 60:
            log.warning(
                "only %.1f MiB free for %s: runs stay queued until there is space (`nightlab doctor`)",
                (free or 0) / 2**20,
                self.path,
            )
            self._warned = now
        return full
