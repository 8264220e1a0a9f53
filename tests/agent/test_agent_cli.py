"""`nightlab agent run | status | stop` from the command line, as a user runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from agent_support import seen_dir, stand_in

from labkit import nightlab, wait_until

seen = pytest.fixture(seen_dir)


def status(lab) -> dict:
    return json.loads(nightlab("agent", "status", "--json", cwd=lab).stdout)


def test_run_in_the_foreground_until_a_limit(make_lab, seen):
    lab = make_lab(slots=1)
    proc = nightlab(
        "agent", "run", "--agent", stand_in("dup"), "--max-experiments", "1", "--stall-seconds", "30", cwd=lab
    )
    assert proc.stdout == "max-experiments\n"
    assert "session 1 started: custom" in proc.stderr and "supervisor stopped: max-experiments" in proc.stderr
    text = nightlab("agent", "status", cwd=lab).stdout
    assert "supervisor: stopped" in text and "stopped: max-experiments" in text
    assert "experiments submitted: 1" in text and "max experiments 1" in text


def test_an_agent_that_keeps_failing_fails_the_run(make_lab, seen):
    lab = make_lab(slots=1)
    proc = nightlab(
        "agent", "run", "--agent", stand_in("fail"), "--max-restarts-per-hour", "1", cwd=lab, check=False
    )
    assert proc.returncode == 1 and proc.stdout == "max-restarts-per-hour\n"
    assert "session 1 ended (exit 3); restarting in 1 s" in proc.stderr


def test_background_status_and_stop(make_lab, seen):
    lab = make_lab(slots=1)
    assert "no agent supervisor has run" in nightlab("agent", "status", cwd=lab).stdout
    assert "no agent supervisor was running" in nightlab("agent", "stop", cwd=lab).stderr
    pid = int(nightlab("agent", "run", "--agent", stand_in("chatty"), "--background", cwd=lab).stdout)
    try:
        state = wait_until(
            lambda: (s := status(lab)).get("agent_pid") and s,
            timeout=20,
            interval=0.1,
            what="the agent's pid",
        )
        assert state["running"] and state["status"] == "running" and state["pid"] == pid
        assert state["agent_alive"] and state["session"] == 1 and state["agent"] == "custom"
        again = nightlab("agent", "run", "--agent", stand_in("chatty"), "--background", cwd=lab, check=False)
        assert again.returncode == 1 and f"already runs for this lab (pid {pid})" in again.stderr
    finally:
        stopped = nightlab("agent", "stop", cwd=lab)
    assert f"agent supervisor (pid {pid}) stopped" in stopped.stderr
    state = status(lab)
    assert not state["running"] and state["status"] == "stopped" and state["stop_reason"] == "stopped"
    agent_pid = json.loads((seen / "env-1.json").read_text())["pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(agent_pid, 0)


def test_a_supervisor_ended_by_a_fatal_signal_leaves_its_stack_in_its_log(make_lab, seen):
    lab = make_lab(slots=1)
    pid = int(nightlab("agent", "run", "--agent", stand_in("chatty"), "--background", cwd=lab).stdout)
    agent_pid = None
    try:
        state = wait_until(lambda: (s := status(lab)).get("agent_pid") and s, timeout=20, what="the agent")
        agent_pid = state["agent_pid"]
        os.kill(pid, signal.SIGBUS)
        log = lab / ".nightlab" / "agent" / "supervisor.log"
        wait_until(lambda: "Fatal Python error: Bus error" in log.read_text(), timeout=30, what="the stack")
    finally:
        kills = [lambda: os.kill(pid, signal.SIGKILL)]
        if agent_pid is not None:  # the agent runs in its own session: its whole group
            kills.append(lambda: os.killpg(agent_pid, signal.SIGKILL))
        for kill in kills:
            try:
                kill()
            except ProcessLookupError:
                pass


def test_bad_agent_and_limits_are_usage_errors(make_lab):
    lab = make_lab(slots=1)
    proc = nightlab("agent", "run", "--agent", "nosuchagent", cwd=lab, check=False)
    assert proc.returncode == 2 and "unknown agent `nosuchagent`" in proc.stderr
    proc = nightlab(
        "agent", "run", "--agent", stand_in("work"), "--max-experiments", "0", cwd=lab, check=False
    )
    assert proc.returncode == 2 and "--max-experiments" in proc.stderr


def test_ctrl_c_stops_a_foreground_run_and_its_agent(make_lab, seen):
    lab = make_lab(slots=1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "nightlab", "agent", "run", "--agent", stand_in("chatty")],
        cwd=lab,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: (seen / "env-1.json").exists(), timeout=20, what="the first session")
    finally:
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err  # Ctrl-C exits 130, as `wait` and `search` do (README)
    assert out == "stopped\n"
    with pytest.raises(ProcessLookupError):
        os.kill(json.loads((seen / "env-1.json").read_text())["pid"], 0)


def test_a_supervisor_that_died_is_reported_dead(make_lab):
    lab = make_lab(slots=1)
    folder = lab / ".nightlab" / "agent"
    folder.mkdir(parents=True)
    state = {"pid": 999999, "status": "running", "agent": "claude", "agent_pid": None, "limits": {}}
    (folder / "state.json").write_text(json.dumps(state))
    assert status(lab)["status"] == "dead" and not status(lab)["running"]
