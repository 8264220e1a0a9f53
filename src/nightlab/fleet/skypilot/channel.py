"""The controller's line to a resident runner: one helper process on the runner's node, JSON lines.

The helper (`resident.py helper`) is started once and kept: on Slurm over `ssh` to the login
node named in `~/.slurm/config` (the entry SkyPilot itself uses) and `srun --overlap` into
the cluster's allocation, so it runs on the runner's node and sees the runner's files as
the runner does (no shared filesystem, no NFS caching between them); with the fake SDK as
a local process. Every request waits at most `ASK_TIMEOUT`: a helper that does not answer
is killed (by PID) and started again at the next request, so a hung connection never
holds the controller. Every request is safe to send again (`resident.py`'s marks).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from nightlab.errors import NightlabError
from nightlab.fleet.skypilot.core import log

ASK_TIMEOUT = 30.0  # seconds one request may take before its helper is given up
START_TIMEOUT = 60.0  # seconds for a new helper's first answer (ssh + srun + Python start)
# the helper reads its own code from its first stdin line: the command line stays short and
# needs no quoting through ssh and srun
BOOT = "import sys, json; exec(json.loads(sys.stdin.readline()))"


class ChannelError(NightlabError):
    """The helper could not be reached, or did not answer in time."""


def slurm_argv(host: str, info: dict[str, Any], base: str, *, config: Path | None = None) -> list[str]:
    """The command that starts a helper on the runner's node of a Slurm cluster.

    Args:
        host: the cluster's `Host` in `~/.slurm/config` (`infra = "slurm/<host>"`).
        info: the runner's announcement (`resident.PREFIX`): its allocation, node and Python.
        base: the runners' directory on that node.
    """
    config = config or Path.home() / ".slurm" / "config"
    remote = [
        "srun",
        "--overlap",
        f"--jobid={info['slurm_job']}",
        f"--nodelist={info['host']}",
        "--nodes=1",
        "--ntasks=1",
        "--quiet",
        info["python"],
        "-u",
        "-c",
        BOOT,
        "helper",
        base,
    ]
    return [
        "ssh",
        "-F",
        str(config),
        "-o",
        "BatchMode=yes",
        "-o",
        "ServerAliveInterval=15",
        "-o",
        "ServerAliveCountMax=4",
        host,
        shlex.join(remote),
    ]


def local_argv(info: dict[str, Any], base: str) -> list[str]:
    """The command that starts a helper on this machine (the fake SDK's clusters are local)."""
    return [info["python"], "-u", "-c", BOOT, "helper", base]


class Channel:
    """One helper process; `ask` sends a request and returns its answer (module docstring)."""

    def __init__(self, argv: list[str], code: str) -> None:
        self.argv = argv
        self.code = code
        self._ask_lock = threading.Lock()  # one request at a time on the pipe
        self._state = threading.Condition()
        self._proc: subprocess.Popen | None = None
        self._answers: dict[int, dict[str, Any]] = {}
        self._ids = 0
        self._closed = False

    def ask(self, op: str, timeout: float = ASK_TIMEOUT, **fields: Any) -> dict[str, Any]:
        """Send one request; its answer, or ChannelError (the helper is then restarted next time)."""
        with self._ask_lock:
            proc, fresh = self._ensure()
            with self._state:
                self._ids += 1
                rid = self._ids
            if fresh:
                timeout = max(timeout, START_TIMEOUT)
            line = json.dumps({"op": op, "id": rid, **fields}) + "\n"
            # a helper that stops reading fills the pipe: the write must not outlast the answer's wait
            watchdog = threading.Timer(timeout, self._drop, (proc, f"`{op}` could not be sent"))
            watchdog.daemon = True
            watchdog.start()
            try:
                proc.stdin.write(line.encode())
                proc.stdin.flush()
            except (OSError, ValueError) as e:
                self._drop(proc, f"write failed: {e}")
                raise ChannelError(f"the runner's helper is gone ({e})") from e
            finally:
                watchdog.cancel()
            deadline = time.time() + timeout
            with self._state:
                while rid not in self._answers:
                    left = deadline - time.time()
                    if left <= 0 or self._proc is not proc or self._closed or proc.poll() is not None:
                        break
                    self._state.wait(min(left, 1.0))
                answer = self._answers.pop(rid, None)
            if answer is None and proc.poll() is not None:
                self._drop(proc, f"it exited ({proc.returncode})")
                raise ChannelError(
                    f"the runner's helper exited ({proc.returncode}) before it answered `{op}`"
                )
            if answer is None:
                self._drop(proc, f"no answer to `{op}` in {timeout:.0f} s")
                raise ChannelError(f"the runner's helper did not answer `{op}` in {timeout:.0f} s")
            if not answer.get("ok"):
                raise ChannelError(f"the runner's helper failed `{op}`: {answer.get('error')}")
            return answer

    def _ensure(self) -> tuple[subprocess.Popen, bool]:
        """The helper process, started when there is none; and whether it was started now."""
        with self._state:
            if self._closed:
                raise ChannelError("the channel is closed")
            if self._proc is not None and self._proc.poll() is None:
                return self._proc, False
        try:
            proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # a Ctrl-C of the controller is not the helper's to see first
            )
        except OSError as e:
            raise ChannelError(f"could not start `{self.argv[0]}` for the runner's helper: {e}") from e
        with self._state:
            self._proc = proc
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()
        threading.Thread(target=self._drain, args=(proc,), daemon=True).start()
        try:
            proc.stdin.write((json.dumps(self.code) + "\n").encode())
            proc.stdin.flush()
        except OSError as e:
            self._drop(proc, f"could not send the helper's code: {e}")
            raise ChannelError(f"the runner's helper did not start: {e}") from e
        return proc, True

    def _read(self, proc: subprocess.Popen) -> None:
        for raw in proc.stdout:
            try:
                answer = json.loads(raw)
            except ValueError:
                log.info("runner helper said: %s", raw[:200])
                continue
            with self._state:
                if isinstance(answer, dict) and isinstance(answer.get("id"), int):
                    self._answers[answer["id"]] = answer
                self._state.notify_all()
        with self._state:
            self._state.notify_all()

    def _drain(self, proc: subprocess.Popen) -> None:
        for raw in proc.stderr:
            log.info("runner helper: %s", raw.decode(errors="replace").rstrip()[:300])

    def _drop(self, proc: subprocess.Popen, why: str) -> None:
        log.info("runner helper dropped: %s", why)
        _kill(proc)
        with self._state:
            if self._proc is proc:
                self._proc = None
            self._state.notify_all()

    def close(self) -> None:
        """Stop the helper (by PID) without waiting for a request in flight."""
        with self._state:
            self._closed = True
            proc, self._proc = self._proc, None
            self._state.notify_all()
        if proc is not None:
            _kill(proc)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, 9)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        log.warning("runner helper %s did not exit", proc.pid)
