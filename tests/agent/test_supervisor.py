"""The supervisor drives a stand-in agent (stand_in_agent.py) in a lab over the synthetic target.

It restarts the agent when it exits, stalls or runs out of context, stops at each limit,
gives every session a prompt with the lab's current state, and refuses a second supervisor.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time

import pytest
from agent_support import seen_dir, stand_in

from labkit import nightlab, wait_json, wait_until
from nightlab.agent.commands import BUILTIN_AGENTS, default_stall_seconds, resolve_agent
from nightlab.agent.control import read_state
from nightlab.agent.supervisor import Limits, Supervisor, restart_delay
from nightlab.config import AgentConfig, load_config
from nightlab.errors import NightlabError, UsageError
from nightlab.ledger import NewExperiment, open_ledger

seen = pytest.fixture(seen_dir)


def supervise(lab, mode: str, *, pause=None, log=None, **limits) -> tuple[str, dict]:
    command = resolve_agent(stand_in(mode), AgentConfig())
    reason = Supervisor(lab, command, Limits(**limits), term_grace=2.0, pause=pause, log=log).run()
    return reason, read_state(lab)


def dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_restarts_on_exit_with_the_labs_state_and_stops_at_max_experiments(make_lab, seen):
    lab = make_lab(slots=2)
    nightlab("submit", "-m", "baseline", "--repeats", "2", cwd=lab)
    wait_json(lab, "--all")
    # session 1's idea is kept only after the one repeat a keep needs; session 2's is a discard
    reason, state = supervise(lab, "work", max_experiments=3, stall_seconds=30)
    assert reason == "max-experiments"
    assert state["status"] == "stopped" and state["stop_reason"] == "max-experiments"
    assert state["experiments_submitted"] == 3
    # session 1 exits by itself and is restarted; after session 2 (stopped at the limit, or
    # exited before the supervisor looked) no third one starts
    assert len(state["sessions"]) == 2 and state["sessions"][0]["end"] == "exit 0"
    assert not (lab / ".nightlab" / "agent" / "prompt-3.md").exists()
    assert state["restarts_total"] == 1

    first, second = (seen / "prompt-1.md").read_text(), (seen / "prompt-2.md").read_text()
    agent_dir = lab / ".nightlab" / "agent"
    assert first == (agent_dir / "prompt-1.md").read_text()  # stdin carried the prompt file
    env = json.loads((seen / "env-2.json").read_text())
    assert env["prompt_file"] == str(agent_dir / "prompt-2.md") and env["cwd"] == str(lab)
    assert "You are starting a research run" in first and "# nightlab: how to do research" in first
    assert "e0003" not in first and "LR 0.01->0.02" not in first
    # the restart prompt knows what session 1 did: the adopted idea is the incumbent and in the journal
    assert "The previous session ended (exit 0)" in second
    assert "- incumbent: " in second and '"adopt e0003: lr 0.02"' in second
    assert "- e0003+1 keep [adopted]: cpu 1.000000" in second and "LR 0.01->0.02" in second
    assert "3 more experiments" not in second and "1 more experiments" in second
    assert "stand-in session 1 mode work" in (agent_dir / "transcript-1.log").read_text()
    assert "$ nightlab adopt e0003 -> 0" in (agent_dir / "transcript-1.log").read_text()


def test_restarts_a_stalled_agent_and_stops_at_the_restart_limit(make_lab, seen):
    lab = make_lab(slots=1)
    start = time.time()
    reason, state = supervise(lab, "hang", stall_seconds=1.0, max_restarts_per_hour=1)
    assert reason == "max-restarts-per-hour"
    assert [s["end"] for s in state["sessions"]] == ["stall", "stall"]
    assert time.time() - start < 120  # two 1 s stalls, not the 30 min default (loose: a busy box is slow)
    assert "The previous session ended (stall)" in (seen / "prompt-2.md").read_text()
    for n in (1, 2):  # every stalled agent was killed, not left behind
        assert dead(json.loads((seen / f"env-{n}.json").read_text())["pid"])


def test_a_failing_agent_is_restarted_with_a_growing_backoff(make_lab, seen):
    lab = make_lab(slots=1)
    waits: list[float] = []
    said: list[str] = []
    limits = {"restart_backoff": 100.0, "restart_backoff_max": 250.0, "max_restarts_per_hour": 3}
    reason, state = supervise(lab, "fail", pause=waits.append, log=said.append, stall_seconds=30, **limits)
    # before: 4 sessions within a second; now each restart waits twice as long, up to the cap
    assert waits == [100.0, 200.0, 250.0]
    assert reason == "max-restarts-per-hour" and [s["end"] for s in state["sessions"]] == ["exit 3"] * 4
    assert "session 1 ended (exit 3); restarting in 100 s" in said
    assert "session 4 ended (exit 3); not restarting" in said
    assert [restart_delay(n, Limits()) for n in (1, 2, 3, 9, 10)] == [1.0, 2.0, 4.0, 256.0, 300.0]


def test_a_stop_request_ends_the_backoff(make_lab, seen):
    lab = make_lab(slots=1)
    command = resolve_agent(stand_in("fail"), AgentConfig())
    supervisor = Supervisor(lab, command, Limits(restart_backoff=3600.0, stall_seconds=30), term_grace=2.0)
    result: list[str] = []
    thread = threading.Thread(target=lambda: result.append(supervisor.run()))
    thread.start()
    try:
        wait_until(
            lambda: (read_state(lab) or {}).get("restarts_total"), timeout=60, what="the first restart"
        )
    finally:
        supervisor.request_stop()
        thread.join(60)
    assert result == ["stopped"] and len(read_state(lab)["sessions"]) == 1


def test_a_degraded_re_run_is_not_the_agents_submission(make_lab, seen):
    lab = make_lab(slots=1)
    said: list[tuple[float, str]] = []
    queued: list[float] = []

    def rerun_while_the_agent_hangs() -> None:
        deadline = time.time() + 60
        while not (seen / "env-1.json").exists() and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(2.0)
        with open_ledger(lab) as ledger:  # what the controller queues for a degraded run
            ledger.add_experiments(
                [NewExperiment("0" * 40, "t", None, "re-run of e0001 (degraded)", "cpu", 0, rerun_of="e0001")]
            )
        queued.append(time.time())

    thread = threading.Thread(target=rerun_while_the_agent_hangs)
    thread.start()
    try:
        reason, state = supervise(
            lab,
            "hang",
            pause=lambda s: None,
            log=lambda line: said.append((time.time(), line)),
            stall_seconds=3.0,
            max_restarts_per_hour=1,
        )
    finally:
        thread.join(60)
    assert reason == "max-restarts-per-hour" and state["experiments_submitted"] == 0
    # the re-run was no sign of life: the stall fired 3 s after the agent's last line, which is
    # less than 3 s after the re-run (counted as activity, it fired 3 s after the re-run: ~5 s in)
    [(stalled_at, line)] = [(t, m) for t, m in said if m.startswith("session 1 stalled")]
    assert stalled_at < queued[0] + 3.0, line
    assert [s["end"] for s in state["sessions"]] == ["stall", "stall"]


def test_a_submission_counts_as_activity(make_lab, seen):
    lab = make_lab(slots=1)
    reason, state = supervise(
        lab, "submit-hang", stall_seconds=8.0, max_restarts_per_hour=1, max_experiments=5
    )
    # session 2 submits the same idea again: refused as a duplicate, so the stand-in exits 1
    assert [s["end"] for s in state["sessions"]] == ["stall", "exit 1"]
    # silent from 0.1 s on, but the submission at 2 s+ restarted the stall clock (else: stall at
    # ~8.1 s); the window is wide because a loaded box takes seconds to run `nightlab submit`
    first = state["sessions"][0]
    assert first["ended_at"] - first["started_at"] >= 9.5
    assert reason == "max-restarts-per-hour"
    assert state["experiments_submitted"] == 1
    assert "e0001" in (seen / "prompt-2.md").read_text()


def test_a_full_context_is_recognised_and_restarted(make_lab, seen):
    lab = make_lab(slots=1)
    reason, state = supervise(lab, "context", stall_seconds=30, max_restarts_per_hour=1)
    assert reason == "max-restarts-per-hour"
    assert [s["end"] for s in state["sessions"]] == ["context", "context"]
    assert [s["exit_code"] for s in state["sessions"]] == [1, 1]


def test_stops_at_max_hours_and_kills_a_busy_agent(make_lab, seen):
    lab = make_lab(slots=1)
    start = time.time()
    reason, state = supervise(lab, "chatty", max_hours=1.5 / 3600, stall_seconds=1.0)
    assert reason == "max-hours"
    assert 1.4 < time.time() - start < 120  # ended by the 1.5 s cap (loose above: a busy box is slow)
    assert [s["end"] for s in state["sessions"]] == ["max-hours"]  # output kept it from stalling
    assert dead(json.loads((seen / "env-1.json").read_text())["pid"])


def test_a_second_supervisor_is_refused_and_a_stop_request_stops_the_first(make_lab, seen):
    lab = make_lab(slots=1)
    command = resolve_agent(stand_in("chatty"), AgentConfig())
    first = Supervisor(lab, command, Limits(stall_seconds=30), term_grace=2.0)
    result: list[str] = []
    thread = threading.Thread(target=lambda: result.append(first.run()))
    thread.start()
    try:
        wait_until(lambda: (seen / "env-1.json").exists(), timeout=20, what="the first session")
        with pytest.raises(NightlabError, match="already runs for this lab"):
            Supervisor(lab, command, Limits()).run()
        assert read_state(lab)["status"] == "running"
    finally:
        first.request_stop()
        thread.join(30)
    assert result == ["stopped"]
    assert read_state(lab)["sessions"][0]["end"] == "stopped"


def test_the_agent_cannot_measure_the_same_files_twice(make_lab, seen):
    lab = make_lab(slots=1)
    reason, state = supervise(lab, "dup", max_restarts_per_hour=1, stall_seconds=30)
    # session 1 submits, is refused the duplicate and exits; session 2's first submit is refused too
    assert [s["end"] for s in state["sessions"]] == ["exit 0", "exit 1"]
    assert reason == "max-restarts-per-hour"
    dup = json.loads((seen / "dup.json").read_text())
    assert dup["first"] == "e0001" and dup["code"] == 2
    # measured, or still queued or running: the message says which (`wait` for the latter)
    assert re.search(r"already (measured by|queued as|running as) e0001 \(`same files`\)", dup["stderr"])
    assert state["experiments_submitted"] == 1


def test_the_prompt_file_placeholder(make_lab, seen):
    lab = make_lab(slots=1)
    seen.mkdir()
    line = f"sh -c 'cp \"$0\" {seen}/copied.md' {{prompt_file}}"
    reason = Supervisor(lab, resolve_agent(line, AgentConfig()), Limits(max_restarts_per_hour=1)).run()
    assert reason == "max-restarts-per-hour"
    assert (seen / "copied.md").read_text() == (lab / ".nightlab" / "agent" / "prompt-2.md").read_text()


# ---------------------------------------------------------------------------- resolving --agent


@pytest.fixture
def fake_bin(tmp_path, monkeypatch):
    """A PATH with fake `claude` and `codex` executables (the real CLIs are not installed here)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("claude", "codex"):
        (folder / name).write_text("#!/bin/sh\nexit 0\n")
        (folder / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return folder


def test_builtin_agents_and_overrides(fake_bin):
    claude = resolve_agent("claude", AgentConfig())
    assert claude.name == "claude" and claude.argv == tuple(BUILTIN_AGENTS["claude"].split())
    assert "--output-format" in claude.argv and "stream-json" in claude.argv and "-p" in claude.argv
    codex = resolve_agent(None, AgentConfig(default="codex"))
    assert codex.argv[:2] == ("codex", "exec") and codex.argv[-1] == "-" and "--json" in codex.argv
    custom = resolve_agent("claude", AgentConfig(commands={"claude": "claude -p --max-turns 50"}))
    assert custom.argv == ("claude", "-p", "--max-turns", "50")
    named = resolve_agent("mine", AgentConfig(commands={"mine": "codex exec -"}))
    assert named.name == "mine" and named.argv == ("codex", "exec", "-")
    assert resolve_agent("sh -c 'echo hi'", AgentConfig()).argv == ("sh", "-c", "echo hi")


def test_unknown_or_missing_agents_are_usage_errors(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UsageError, match="unknown agent `gpt5`; use claude, codex"):
        resolve_agent("gpt5", AgentConfig())
    with pytest.raises(UsageError, match="`claude` \\(agent `claude`\\) is not on PATH"):
        resolve_agent("claude", AgentConfig())
    with pytest.raises(UsageError, match="does not parse"):
        resolve_agent("sh -c 'unclosed", AgentConfig())


def test_default_stall_covers_one_wait_on_a_run_at_the_time_limit(make_lab):
    lab = make_lab(slots=1, timeout=1200)
    config = load_config(lab / "nightlab.toml")
    assert default_stall_seconds(config) == 1500.0
    (lab / "nightlab.toml").write_text(
        (lab / "nightlab.toml").read_text() + "\n[agent]\nstall_seconds = 60\n"
    )
    assert default_stall_seconds(load_config(lab / "nightlab.toml")) == 60.0
