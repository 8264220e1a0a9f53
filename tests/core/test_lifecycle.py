"""The one process-lifecycle helper (`nightlab.lifecycle`) and its two users, the fleet
controller (`fleet/daemon.py`) and the agent supervisor (`agent/control.py`).

Both must answer "is it running" the same way in every state (nothing, starting, running),
and a stop that comes while the process is still starting must stop it: the controller's
start used to reset the ledger's stop flag, so `fleet stop` timed out while it ran on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from labkit import wait_until
from nightlab.agent import control
from nightlab.fleet import daemon, local
from nightlab.lifecycle import START_GRACE, Singleton, alive, group_alive
from nightlab.lifecycle import _read_pid as read_pid
from nightlab.locks import try_lock

# A stand-in owner: takes the lock, stays "starting" (lock held, no pid) for START s, then
# publishes its pid and runs until SIGTERM, which it handles like the real two do.
OWNER = textwrap.dedent(
    """
    import signal, sys, time
    from pathlib import Path
    from nightlab.lifecycle import Singleton
    from nightlab.locks import try_lock
    lock, pid, start, linger = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
    process = Singleton(lock, pid, marker=chr(0).join(sys.argv[5:]) + chr(0))
    stopped = []
    with try_lock(lock, patience=5) as got:
        assert got is not None
        signal.signal(signal.SIGTERM, lambda *_: stopped.append(1))
        time.sleep(start)  # still starting: a stop now must not be lost
    # the real owners hold the lock across this; the stand-in re-takes it to publish its pid
    with process.hold(patience=5, on_stop=lambda *_: stopped.append(1)) as held:
        assert held
        while not stopped:
            time.sleep(0.02)
    time.sleep(linger)  # the lock is free, the process still winds down
    """
)


def singletons(lab: Path) -> dict[str, Singleton]:
    return {"controller": daemon.process(lab), "supervisor": control.process(lab)}


def running(lab: Path, kind: str) -> int | None:
    return {"controller": daemon.running_pid, "supervisor": control.running_pid}[kind](lab)


def owner(process: Singleton, lab: Path, start: float, linger: float = 0.0) -> subprocess.Popen:
    # the stand-in's command line carries the real one's marker (`marker.split("\0")` as arguments)
    paths = [str(process.lock_path), str(process.pid_path)]
    args = [sys.executable, "-c", OWNER, *paths, str(start), str(linger)]
    return process.start([*args, *process.marker.split("\0")[:-1]], lab / "owner.log")


@pytest.fixture
def lab(tmp_path):
    directory = tmp_path / "lab"
    (directory / ".nightlab" / "agent").mkdir(parents=True)
    return directory


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.mark.parametrize("kind", ["controller", "supervisor"])
def test_both_background_processes_follow_one_rule(kind, lab, procs):
    process = singletons(lab)[kind]
    assert running(lab, kind) is None
    proc = owner(process, lab, start=1.0)
    procs.append(proc)
    # started and not yet holding its pid: starting (-1), for both kinds alike
    wait_until(lambda: running(lab, kind) == -1, timeout=10, interval=0.01, what="the starting mark")
    wait_until(lambda: running(lab, kind) != -1, timeout=10, interval=0.01, what="the published pid")
    assert running(lab, kind) == proc.pid == read_pid(process.pid_path)
    assert not process.starting_path.exists()  # the owner took over from the starter's note
    assert process.stop(timeout=10) == proc.pid
    assert proc.wait(timeout=5) == 0  # it handled SIGTERM and left cleanly
    assert running(lab, kind) is None and not process.pid_path.exists()


def test_a_stop_returns_once_the_process_is_gone_not_when_its_lock_drops(lab, procs):
    """ci6: `fleet stop` returned while the controller, its lock already free, still wound down;
    the reboot test then counted it as a process left behind."""
    process = daemon.process(lab)
    proc = owner(process, lab, start=0.0, linger=1.5)
    procs.append(proc)
    wait_until(lambda: running(lab, "controller") == proc.pid, timeout=10, what="the owner's pid")
    assert process.stop(timeout=15) == proc.pid
    assert proc.poll() is not None  # exited (a zombie until reaped here), not lingering on
    assert proc.returncode == 0


@pytest.mark.parametrize("kind", ["controller", "supervisor"])
@pytest.mark.parametrize("moment", ["just-started", "holding-the-lock"])
def test_a_stop_while_it_starts_is_not_lost(kind, moment, lab, procs):
    process = singletons(lab)[kind]
    proc = owner(process, lab, start=1.5)
    procs.append(proc)
    if moment == "holding-the-lock":  # it handles SIGTERM now but has not published its pid

        def held() -> bool:
            with try_lock(process.lock_path) as got:
                return got is None

        wait_until(held, timeout=10, interval=0.01, what="the owner holding its lock")
    # the stop comes before the owner published its pid: it signals the pid the starter noted,
    # or waits for the published one; either way the owner stops
    t0 = time.time()
    assert process.stop(timeout=15) == proc.pid
    assert time.time() - t0 < 10
    code = proc.wait(timeout=5)
    # before its handler exists SIGTERM's default action ends it; after, it leaves cleanly
    assert code == 0 if moment == "holding-the-lock" else code in (0, -15)
    assert running(lab, kind) is None


def test_a_stale_note_or_pid_file_is_not_trusted(lab):
    process = daemon.process(lab)
    dead = subprocess.Popen(["true"])
    dead.wait()
    process.starting_path.write_text(str(dead.pid))
    process.pid_path.write_text(str(os.getpid()))  # no lock held: a leftover of a killed owner
    assert process.running_pid() is None
    # a live pid that is not ours (no marker in its command line) is no starting owner either; a
    # child of known command line, not this process (a pytest-xdist worker retitles itself)
    live = subprocess.Popen(["sleep", "30"])
    try:
        wait_until(lambda: alive(live.pid, marker="sleep"), what="the child's exec of sleep")
        process.starting_path.write_text(str(live.pid))
        assert Singleton(process.lock_path, process.pid_path, marker="/no/such/lab").running_pid() is None
        # nor is one that is ours but was noted longer ago than any start takes (its start failed)
        ours = Singleton(process.lock_path, process.pid_path, marker="sleep")
        assert ours.running_pid() == -1
        old = time.time() - START_GRACE - 1
        os.utime(process.starting_path, (old, old))
        assert ours.running_pid() is None
    finally:
        live.kill()
        live.wait()


def test_alive_has_one_answer_for_every_caller(tmp_path):
    """The fleet's local runs, the supervisor's agent and the two singletons ask `lifecycle.alive`."""
    sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert local.alive is alive and control.alive is alive
        # Popen returns after the fork: the command line is python's until the exec (seen under load)
        wait_until(lambda: alive(sleeper.pid, marker="sleep"), what="the child's exec of sleep")
        assert alive(sleeper.pid)
        assert not alive(sleeper.pid, marker="something else")  # a recycled pid is not ours
        assert group_alive(sleeper.pid)
        assert not alive(None) and not alive(-1) and not alive(0)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not alive(sleeper.pid) and not alive(sleeper.pid, marker="sleep")
    assert not group_alive(sleeper.pid)


def test_fleet_stop_stops_a_controller_that_is_still_starting(make_lab):
    """`nightlab submit` starts a controller without waiting; a `fleet stop` right after must stop it.

    Before the fix the stop saw no controller (or a starting one), wrote the ledger's stop flag,
    which the start then reset, and returned while the controller ran on.
    """
    lab = make_lab(slots=1)
    started = daemon.start_background(lab, wait=False)
    assert started.new
    pid = started.pid
    try:
        stopped = daemon.stop(lab, timeout=30)
        assert stopped == pid
        time.sleep(1.0)  # long enough for a controller that survived to show itself
        assert daemon.running_pid(lab) is None
        assert not alive(pid)
        from nightlab.ledger import open_ledger

        with open_ledger(lab) as ledger:
            assert ledger.controller() is None  # no row left: nothing for `revive` to restart
    finally:
        if alive(pid):
            os.kill(pid, 9)


def test_status_says_starting_and_names_no_stale_pid_while_the_controller_starts(make_lab, procs):
    """`status --json` used to say running with the previous controller's pid (or null) then."""
    from nightlab.lab import Lab
    from nightlab.ledger import open_ledger
    from nightlab.views import controller_state

    lab = make_lab(slots=1)
    with Lab.open(lab) as opened:
        assert controller_state(opened) == {
            "running": False,
            "starting": False,
            "pid": None,
            "heartbeat_age": None,
        }
    with open_ledger(lab) as ledger:
        ledger.claim_controller(999_999, "old-host")  # the record a previous controller left
    with Lab.open(lab) as opened:
        assert controller_state(opened)["pid"] == 999_999  # stopped: the last one's pid
        proc = owner(daemon.process(lab), lab, start=1.0)
        procs.append(proc)
        state = wait_until(
            lambda: (s := controller_state(opened))["starting"] and s,
            timeout=10,
            interval=0.01,
            what="the starting state",
        )
        assert state["starting"] and state["running"] and state["pid"] is None
        wait_until(
            lambda: not controller_state(opened)["starting"], timeout=10, interval=0.01, what="the pid"
        )
        state = controller_state(opened)
        assert state["running"] and not state["starting"] and state["pid"] == proc.pid
        assert daemon.process(lab).stop(timeout=10) == proc.pid
