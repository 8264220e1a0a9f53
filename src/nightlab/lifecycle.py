"""A lab's background process: its lock, its pid file, starting it detached, finding and stopping it.

Two processes live beside a lab and follow the same rules: the fleet controller
(`fleet/daemon.py`) and the agent supervisor (`agent/supervisor.py`). Each is a `Singleton`:

- **lock**: an exclusive `flock` held for the process's whole life (`locks.try_lock`). The
  kernel drops it however the process dies, so a stale lock never blocks a restart.
- **pid file**: written once the lock is held (and the stop signal handled), removed on the
  way out. It is read only while the lock is held, so a stale file is never trusted.
- **starting note**: `start` writes the new process's pid to `*.starting` at once, so a
  process that has not taken the lock yet is seen too (for at most `START_GRACE` s, and only
  while that pid runs a command line with the singleton's marker).
- **running pid**: None when nobody holds the lock and nothing is starting; the pid when the
  holder wrote it; -1 while one starts (noted, or lock held and pid not yet written).
- **start lock**: starters take `*.start.lock` around look-then-start (`starting_alone`), so
  two `fleet start` at once make one process and the second reports its real pid (without
  it both saw "none runs", and the loser printed `already running (pid -1)`).
- **stop**: SIGTERM to the pid, then wait for the lock to drop. A process that is still
  starting gets it at its noted pid (before its handler exists, SIGTERM's default action ends
  it) or, once it holds the lock, at its published pid. Signalling it is what makes
  the stop stick: a stop request written somewhere else before the process read it could be
  reset by the start (the controller's start reset the ledger's stop flag: `fleet stop` then
  timed out while the controller ran on).

`alive` and `group_alive` are the one answer to "does this pid still run" for the fleet's
local runs, the agent and these processes: a pid we may not signal exists (alive), but it is
not ours when a marker is asked for (a recycled pid of another user's process).

Usage:
    controller = fleet.daemon.process(lab)        # Singleton(lock, pid file, marker)
    with controller.hold(patience=0.5) as held:   # in the process itself
        ...
    controller.stop(timeout=30)                   # from anywhere
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from nightlab.locks import try_lock

POLL = 0.05  # seconds between looks while waiting for a start or a stop
# A started process takes its lock within seconds (the controller's start waits 20 s at most);
# a `starting` note older than this is a start that failed, whatever its pid runs now.
START_GRACE = 60.0


def alive(pid: int | None, *, marker: str | None = None) -> bool:
    """Whether process `pid` runs (a zombie does not); with `marker`, also that its command line holds it.

    A pid we may not signal exists but is not ours: with a marker that is False. Without /proc
    (macOS) the marker cannot be checked and the pid is trusted.
    """
    if not pid or pid < 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return marker is None
    if _zombie(pid):
        return False  # exited, not yet reaped by its parent (the starter itself, in one process)
    if marker is None:
        return True
    cmdline = _cmdline(pid)
    if cmdline is None:
        # no /proc (macOS): trust the pid; with /proc, the process ended between the two looks
        return not Path("/proc/self").exists()
    return marker.encode() in cmdline


def group_alive(pgid: int) -> bool:
    """Whether any process of process group `pgid` still exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(proc: subprocess.Popen, *, grace: float, kill_wait: float = 5.0) -> None:
    """Stop the process group led by `proc`: SIGTERM, then SIGKILL after `grace` s; reap `proc`.

    Also after `proc` exited by itself: what it left running in its group goes too.
    """
    for sig, patience in ((signal.SIGTERM, grace), (signal.SIGKILL, kill_wait)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        deadline = time.time() + patience
        while time.time() < deadline:
            if proc.poll() is not None and not group_alive(proc.pid):
                return
            time.sleep(POLL)
    proc.wait()


def start_detached(args: list[str], log_path: Path) -> subprocess.Popen:
    """Start `args` in its own session, stdin closed, stdout and stderr appended to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


class ProcessTimeout(Exception):
    """The process did not stop (or a start did not finish) in time; `pid` says which."""

    def __init__(self, pid: int) -> None:
        super().__init__(pid)
        self.pid = pid


@dataclass(frozen=True)
class Singleton:
    """One background process of a lab, known by its lock file and its pid file.

    `marker` is a string in the process's command line (NUL-separated arguments, e.g. the
    module and the lab's path): a `starting` pid that no longer runs it was recycled and is ignored.
    """

    lock_path: Path
    pid_path: Path
    marker: str

    @property
    def starting_path(self) -> Path:
        """Where `start` notes the pid of a process it started that has not taken the lock yet."""
        return self.pid_path.with_suffix(".starting")

    def running_pid(self) -> int | None:
        """The holder's pid; -1 while one starts (started, pid not yet written); None when none runs."""
        with try_lock(self.lock_path) as got:
            if got is not None:
                return -1 if self._starting() is not None else None
        return _read_pid(self.pid_path) or -1

    def _starting(self) -> int | None:
        try:
            noted = self.starting_path.stat().st_mtime
        except FileNotFoundError:
            return None
        pid = _read_pid(self.starting_path)
        if not alive(pid) or time.time() - noted > START_GRACE:
            # a start that failed before it took the lock (or a recycled pid): not starting
            return None
        # measured: for a moment after Popen returns the new process's command line is empty
        # (it is still exec'ing); that is the process we started, not a recycled pid
        return pid if alive(pid, marker=self.marker) or _cmdline(pid) == b"" else None

    @contextlib.contextmanager
    def starting_alone(self, *, patience: float) -> Iterator[bool]:
        """Hold the start lock: yield whether this starter has it (within `patience` s).

        Look (`settled_pid`) and `start` inside it: another starter waits its turn and then
        finds the process this one started.
        """
        with try_lock(self.pid_path.with_suffix(".start.lock"), patience=patience) as lock:
            yield lock is not None

    def settled_pid(self, *, timeout: float) -> int | None:
        """`running_pid`, waiting out a start in progress (-1) for up to `timeout` s: the pid once
        written, None if that start failed, -1 if it is still starting at the deadline."""
        deadline = time.time() + timeout
        while True:
            pid = self.running_pid()
            if pid is None or pid > 0 or time.time() >= deadline:
                return pid
            time.sleep(POLL)

    def start(self, args: list[str], log_path: Path) -> subprocess.Popen:
        """Start `args` detached (`start_detached`) and note it as starting until it holds the lock."""
        proc = start_detached(args, log_path)
        self.starting_path.write_text(str(proc.pid))
        return proc

    @contextlib.contextmanager
    def hold(self, *, patience: float = 0.0, on_stop: Callable[..., object] | None = None) -> Iterator[bool]:
        """In the process itself: take the lock and write the pid file; yield whether it got them.

        `on_stop` becomes the SIGTERM handler before the pid is written (main thread only; the
        old handler is back on exit), so a `stop` that sees the pid reaches a process that handles it.
        """
        with try_lock(self.lock_path, patience=patience) as lock:
            if lock is None:
                yield False
                return
            previous = None
            if on_stop is not None and threading.current_thread() is threading.main_thread():
                previous = signal.signal(signal.SIGTERM, on_stop)
            # the starter's note goes first: whoever sees the pid sees the start over (under load
            # a reader once saw the pid while the note was still there)
            if _read_pid(self.starting_path) == os.getpid():
                self.starting_path.unlink(missing_ok=True)
            self.pid_path.write_text(str(os.getpid()))
            try:
                yield True
            finally:
                self.pid_path.unlink(missing_ok=True)
                if previous is not None:
                    signal.signal(signal.SIGTERM, previous)

    def wait_started(self, proc: subprocess.Popen, *, timeout: float) -> int | None:
        """Wait until a process holds the lock with its pid written: that pid (`proc`'s or a
        racer's); None if `proc` exited first (its code is `proc.returncode`).

        Raises:
            ProcessTimeout: nothing came up within `timeout` s.
        """
        deadline = time.time() + timeout
        while time.time() < deadline:
            pid = self.running_pid()
            if pid is not None and pid > 0:
                return pid
            if proc.poll() is not None:
                return None
            time.sleep(POLL / 2)
        raise ProcessTimeout(proc.pid)

    def stop(self, *, timeout: float) -> int | None:
        """SIGTERM the running process and wait until its lock drops and it has exited; its pid,
        or None if none ran.

        A process still starting is waited for until its pid is known, then signalled. The lock
        drops before the interpreter has wound down (measured under load: a `fleet stop` returned
        while the controller still ran), so the pid is followed to its end too.

        Raises:
            ProcessTimeout: it did not stop within `timeout` s (`pid` is -1 if its start never finished).
        """
        pid = self.running_pid()
        if pid is None:
            return None
        # a process that has not taken the lock yet dies of SIGTERM's default action: that is a stop too
        known = pid if pid > 0 else self._starting()
        deadline = time.time() + timeout
        signalled = False
        while True:
            if known is not None and not signalled:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(known, signal.SIGTERM)
                signalled = True
            if time.time() >= deadline:
                raise ProcessTimeout(known or -1)
            time.sleep(POLL)
            pid = self.running_pid()
            if pid is None and not alive(known, marker=self.marker):
                return known or -1
            if known is None:
                known = pid if pid > 0 else self._starting()  # its start went on: now it can be told


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def _cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].startswith("Z")
