"""The processes of one run: found by the mark in their environment, ended together.

A run's processes leave its process group and session (`setsid`, a daemon's double fork,
bubblewrap's `--new-session`) and outlive their parents, so once a parent died neither the
group nor the tree finds them all. What they keep is their environment: whoever starts a run
sets `NIGHTLAB_ATTEMPT=<id>` in it (the local backend: the attempt's folder, unique on the
machine; the SkyPilot resident runner: epoch/name), every child inherits it, and
`/proc/<pid>/environ` shows it from outside, setsid or not. A process that execs itself with a
cleaned environment sheds the mark; the tree and the session still find it while its parent
lives. Measured on the dev box: one pass over /proc with every environment read is ~30 us per
process (2.3 ms for a /proc of 82 entries).

Users: the local backend (a kill ends every marked process, and a run's end is reported only
once none is left, so a retry never starts beside the old attempt), the harness supervisor (as
the subreaper of train.py it ends its own descendants before it scores, and train.py's direct
process gets SIGKILL when the supervisor dies), machine health (`fleet/health.py` samples every
process of a run), and the SkyPilot resident runner, which ships this file's text inside its own
(`fleet/skypilot/residents.py` SOURCE): so stdlib only, Python >= 3.8. Linux /proc; elsewhere
nothing is found.

Usage:
    env[MARK] = str(run_dir)                        # when the run starts
    left = end_run(root_pid, str(run_dir))          # SIGKILL all of it; [] once all are gone
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable

MARK = "NIGHTLAB_ATTEMPT"  # every process of a run carries MARK=<the run's id> in its environment
END_POLL = 0.05  # seconds between looks while a run's processes die


def table() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, session id, start time in clock ticks) of every live process (not zombies)."""
    out = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                # the command name may hold spaces and parentheses: fields start after the last ')'
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 19 and fields[0] not in (b"Z", b"X"):
            out[int(entry)] = (int(fields[1]), int(fields[3]), int(fields[19]))
    return out


def mark_of(pid: int) -> str | None:
    """The value of MARK in a process's environment; None when absent or unreadable."""
    prefix = MARK.encode() + b"="
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return None
    for item in data.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return None


def run_processes(
    root: int | None,
    mark: str | None,
    procs: dict[int, tuple[int, int, int]] | None = None,
    marks: Callable[[int], str | None] = mark_of,
) -> list[int]:
    """Every process of a run but this one: the tree under `root`, its session, and whatever carries `mark`.

    Args:
        root: the run's first process (its wrapper), or None once that is gone.
        mark: the run's MARK value, or None to look at the tree and session only.
        procs: `table()`, when the caller already took it (one pass serves many runs).
        marks: how to read a process's mark (`mark_of`; health passes one with memory).

    The session catches what `timeout` moved to a process group of its own (only when `root`
    leads it); the mark catches what left the session and the tree.
    """
    procs = table() if procs is None else procs
    found = set()
    if root is not None and root in procs:
        found.add(root)
        if procs[root][1] == root:
            found.update(p for p, row in procs.items() if row[1] == root)
        grew = True
        while grew:
            more = {p for p, row in procs.items() if row[0] in found and p not in found}
            found |= more
            grew = bool(more)
    if mark is not None:
        found.update(p for p in procs if p not in found and marks(p) == mark)
    found.discard(os.getpid())
    return sorted(found)


def signal_all(pids: list[int], sig: int) -> None:
    """Send `sig` to each pid; ones already gone (or not ours) are skipped."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def end_run(root: int | None, mark: str | None, patience: float = 10.0) -> list[int]:
    """SIGKILL every process of a run until none is left; returns those still there after `patience` s.

    A killed process leaves `table()` once it is a zombie, so this waits only for the kernel to
    deliver the signals (milliseconds), or for a process stuck in the kernel (a hung mount, a GPU
    driver), which is what a non-empty answer means.
    """
    deadline = time.monotonic() + patience
    while True:
        left = run_processes(root, mark)
        if not left or time.monotonic() > deadline:
            return left
        signal_all(left, signal.SIGKILL)
        time.sleep(END_POLL)


# ---------------------------------------------------------------------------- prctl (Linux)

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl():
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants, so they stay in its tree.

    A daemon that double-forks and calls setsid is then still this process's descendant, and
    `run_processes(os.getpid(), None)` finds it. Returns whether the kernel agreed.
    """
    prctl = _prctl()
    return prctl is not None and prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def signal_on_parent_death(sig: int) -> None:
    """Have the kernel send this process `sig` when its parent dies (Linux; elsewhere nothing).

    For a helper that must not outlive what started it (`fleet/worker_health.py`'s sampler, whose
    run script a cancelled job may kill). A parent already gone sends it at once.
    """
    prctl = _prctl()
    if prctl is None:
        return
    parent = os.getppid()
    prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != parent or parent == 1:
        os.kill(os.getpid(), sig)


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child get SIGKILL when this process dies; None off Linux.

    The kernel sends it when the thread that forked the child exits, so start the child from the
    thread that lives as long as the process (the main thread). It reaches the direct child only:
    what that child starts is found by the mark.
    """
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died between the fork and the prctl
            os._exit(1)

    return arm
