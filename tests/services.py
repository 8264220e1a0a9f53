"""A stopped test run leaves nothing behind: a pytest plugin for fixtures that start real services.

Two layers, because `timeout`, Ctrl-C, a CI runner and the OOM killer end a run differently:

1. SIGTERM becomes KeyboardInterrupt in pytest's main thread (`pytest_configure`), as Ctrl-C
   already is: pytest then stops and still runs every fixture's finalizer (`LocalSky.down()`,
   `LoopbackNet.close()`, the fleet stops), so services end the way a passing run ends them.
2. A watchdog process (`Watchdog`, the session fixture `watchdog`) outlives pytest in a session of
   its own and holds the read end of a pipe whose write end only pytest holds: when pytest dies,
   even by SIGKILL, the read returns EOF and the watchdog runs the cleanup commands registered
   (`on_death`), then ends every process still registered (`guard`; SIGTERM, then SIGKILL).
   A process is recognised by its PID and start time, so a reused PID is never signalled.
   A fixture that stops its service itself calls `release`; at a normal end nothing is left.

tests/conftest.py imports the hooks and the fixture; `pytest -p services` loads them in any run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

GRACE = 5.0  # seconds between SIGTERM and SIGKILL


def _start_time(pid: int) -> str | None:
    """The live process's start time in clock ticks since boot (/proc/PID/stat field 22), or None
    when it is gone or a zombie (dead, not yet reaped)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else fields[19]


def _on_sigterm(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM ends the run as Ctrl-C does, so fixtures' finalizers stop what they started."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


class Watchdog:
    """Ends the registered processes and runs the registered commands when this process dies."""

    def __init__(self) -> None:
        fd, record = tempfile.mkstemp(prefix="nightlab-watchdog-", suffix=".json")
        os.close(fd)
        self.record = Path(record)
        self.entries: dict[str, dict] = {}  # pid -> {"start": ..., "group": ...}
        self.commands: list[list[str]] = []
        self._lock = threading.Lock()
        self._save()
        read, self._write = os.pipe()  # both ends non-inheritable: no service keeps the pipe open
        self.proc = subprocess.Popen(
            [sys.executable, __file__, str(read), str(self.record)],
            pass_fds=(read,),
            start_new_session=True,  # a signal to pytest's process group does not reach it
            stdin=subprocess.DEVNULL,
        )
        os.close(read)

    def _save(self) -> None:
        tmp = self.record.with_suffix(".tmp")
        tmp.write_text(json.dumps({"processes": self.entries, "commands": self.commands}))
        os.replace(tmp, self.record)

    def guard(self, pid: int, *, group: bool = False) -> None:
        """End `pid` (its process group when `group`) if this process dies before `release(pid)`."""
        with self._lock:
            self.entries[str(pid)] = {"start": _start_time(pid), "group": group}
            self._save()

    def release(self, pid: int) -> None:
        """The fixture stopped `pid` itself."""
        with self._lock:
            self.entries.pop(str(pid), None)
            self._save()

    def on_death(self, argv: list[str]) -> None:
        """Run `argv` (before the registered processes are ended) if this process dies first."""
        with self._lock:
            self.commands.append(list(argv))
            self._save()

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start a service in a process group of its own, guarded."""
        proc = subprocess.Popen(argv, start_new_session=True, **kwargs)
        self.guard(proc.pid, group=True)
        return proc

    def close(self) -> None:
        """The session ended normally: the watchdog ends what is still registered, then exits."""
        with self._lock:
            self.commands.clear()  # the fixtures' finalizers did what the commands would do
            self._save()
        with contextlib.suppress(OSError):
            os.close(self._write)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(GRACE * 3)
        with contextlib.suppress(OSError):
            self.record.unlink()


@pytest.fixture(scope="session")
def watchdog():
    """The session's `Watchdog` (see the module docstring)."""
    dog = Watchdog()
    try:
        yield dog
    finally:
        dog.close()


def _end(entries: dict[str, dict]) -> None:
    """SIGTERM every registered process that is still the one registered, then SIGKILL the rest."""
    live = {int(pid): e for pid, e in entries.items() if e["start"] and _start_time(int(pid)) == e["start"]}

    def send(sig: int) -> None:
        for pid, e in live.items():
            if _start_time(pid) == e["start"]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    (os.killpg if e["group"] else os.kill)(pid, sig)

    send(signal.SIGTERM)
    deadline = time.time() + GRACE
    while time.time() < deadline and any(_start_time(p) == e["start"] for p, e in live.items()):
        time.sleep(0.1)
    send(signal.SIGKILL)


def _watch(read_fd: int, record: Path) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches pytest; the watchdog waits for it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while os.read(read_fd, 4096):  # blocks until the pytest process closes the pipe or dies
        pass
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return
    for argv in data.get("commands", []):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(argv, stdin=subprocess.DEVNULL, timeout=300, check=False)
    _end(data.get("processes", {}))
    with contextlib.suppress(OSError):
        record.unlink()


if __name__ == "__main__":
    _watch(int(sys.argv[1]), Path(sys.argv[2]))
