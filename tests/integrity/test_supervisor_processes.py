"""The supervisor ends every process train.py started before it scores, daemons included.

A train.py that starts a daemon (double fork + setsid: no process group, session or parent of
the run left) which would go on writing after train.py exits. The supervisor is the subreaper of
everything train.py starts, so the daemon is still in its tree and is gone when it returns, with
or without the sandbox (with it, bwrap's PID namespace ends it too).
Run: .venv/bin/python -m pytest -q tests/integrity/test_supervisor_processes.py (~20 s)
"""

from __future__ import annotations

import os

import pytest
from redteam import SANDBOXED

DAEMON = """\
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open("daemon-started", "w").close()
        while True:
            open("daemon-was-here", "w").close()
            time.sleep(0.1)
    os._exit(0)
os.wait()
while not os.path.exists("daemon-started"):
    time.sleep(0.05)
"""


def _working_in(folder) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/cwd") == str(folder):
                    found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.mark.parametrize(
    "sandbox",
    [
        pytest.param(True, id="bwrap", marks=pytest.mark.skipif(not SANDBOXED, reason="no sandbox here")),
        pytest.param(False, id="no-sandbox"),
    ],
)
def test_a_daemon_train_py_started_is_gone_when_the_supervisor_returns(attack, sandbox):
    run = attack(DAEMON, sandbox=sandbox)
    assert (run.work / "daemon-started").exists(), run.log[-2000:]
    left = _working_in(run.work)
    for pid in left:  # never leave it running, even when the test fails
        os.kill(pid, 9)
    assert left == []
    assert run.outcome == "invalid", run.detail  # it handed in no model
