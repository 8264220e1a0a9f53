"""How the supervisor handles the real CLIs' failures, played by the scripted server.

- running as root: Claude Code's guard, met with a one-line refusal, never a restart loop;
- an API outage (a 429, then 529 / 500 for a while): read from the real transcript, waited out with a
  capped exponential backoff shown in `agent status` and the dashboard, resumed on recovery,
  while the fleet keeps running;
- a full context ("prompt is too long", "ran out of room"): a restart with a fresh prompt;
- a stream that stalls after its headers: the CLI's own idle timeout gives up, the run goes on;
- a server that never answers: the stall watchdog kills the agent's process group, restarts,
  and `--max-hours` ends the run;
- `--max-cost`: the agent stops at the cap (Codex's during its session), the fleet does not.

Run: .venv/bin/python -m pytest -q tests/agent_real/test_real_failures.py
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from pathlib import Path

import pytest
from real_support import CLIS, agent_run, cli_env, finish, state, stop
from scripted_server import ResearchPolicy, ScriptedServer

from labkit import commit, nightlab, wait_json, wait_until

OUTAGE = {"claude": "529", "codex": "500"}


def agent_toml(lab: Path, text: str) -> None:
    toml = lab / "nightlab.toml"
    toml.write_text(toml.read_text() + "\n[agent]\n" + text)
    commit(lab, "agent settings")


def dead_group(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_as_root_a_guarded_line_refuses_with_one_line_not_a_restart_loop(make_lab, bins, net, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("Claude Code's root guard only shows as root")
    lab = make_lab(slots=1)
    with net.call(ScriptedServer) as server:
        env = cli_env("claude", server.url, tmp_path / "home", bins)
        # the user's own line without the sandbox variable: what Claude Code does as root
        line = (
            "env -u IS_SANDBOX claude -p --output-format stream-json --verbose --dangerously-skip-permissions"
        )
        start = time.time()
        code, out, err = finish(agent_run(net, lab, env, "--agent", line), timeout=60)
    assert code == 1 and out == "failed-at-start\n", err
    assert time.time() - start < 20
    [line_] = [ln for ln in err.splitlines() if "exited at start" in ln]
    assert "cannot be used with root/sudo privileges" in line_ and "IS_SANDBOX=1" in line_
    st = state(lab)
    assert len(st["sessions"]) == 1 and st["restarts_total"] == 0 and server.requests == []
    assert "cannot be used with root/sudo" in nightlab("agent", "status", cwd=lab).stdout


@pytest.mark.parametrize("cli", CLIS)
def test_an_api_outage_is_waited_out_with_backoff_and_the_fleet_keeps_running(
    cli, make_lab, bins, net, tmp_path
):
    lab = make_lab(slots=1)
    agent_toml(lab, "api_backoff_seconds = 1\napi_backoff_max_seconds = 2\n")
    slow = nightlab("submit", "-m", "slow", "--set", "SLEEP=6", cwd=lab).stdout.split()[0]
    with net.call(ScriptedServer, ResearchPolicy(per_session=1)) as server:
        server.fail("429", 1)  # rate limited first (Codex gives up at once without Retry-After)
        server.fail(OUTAGE[cli], 10**6)  # then overloaded / down until cleared
        env = cli_env(cli, server.url, tmp_path / "home", bins)
        proc = agent_run(net, lab, env, "--agent", cli, "--max-experiments", "1", "--stall-seconds", "60")
        try:
            wait_until(
                lambda: (state(lab).get("api") or {}).get("failures", 0) >= 3,
                timeout=60,
                interval=0.1,
                what="three failed sessions",
            )
            st = state(lab)
            assert st["api"]["delay"] == 2.0  # 1 s, 2 s, then capped at 2 s
            text = nightlab("agent", "status", cwd=lab).stdout
            assert "API unavailable since " in text and ", next try at " in text
            from nightlab.web._agent import agent_state

            assert agent_state(lab)["outage"].startswith("API unavailable since ")
            # the fleet ran the queued experiment meanwhile
            [done] = wait_json(lab, slow, timeout=60)
            assert done["status"] == "finished" and state(lab)["api"] is not None
            server.clear_failures()
            code, out, err = finish(proc, timeout=60)
        finally:
            stop(proc)
    assert code == 0 and out == "max-experiments\n", err
    st = state(lab)
    ends = [s["end"] for s in st["sessions"]]
    assert ends[:3] == ["api-error"] * 3 and "api-error" not in ends[-1:]
    assert st["restarts_total"] == 0  # an outage is waited out, not counted against the restart limit
    assert st["api"] is None and len(st["api_outages"]) == 1 and st["api_outages"][0]["failures"] >= 3
    assert "(in 1 s)" in err and "(in 2 s)" in err and "API available again after" in err
    first = (lab / ".nightlab" / "agent" / "transcript-1.log").read_text()
    # the real failure, as each CLI writes it
    assert ('"terminal_reason":"api_error"' if cli == "claude" else '"type":"turn.failed"') in first
    assert [r.answered for r in server.requests][0] == "429"
    assert {r.answered for r in server.requests} >= {"429", OUTAGE[cli], "nightlab results --json"}


@pytest.mark.parametrize("cli", CLIS)
def test_a_full_context_restarts_with_a_fresh_prompt(cli, make_lab, bins, net, tmp_path):
    lab = make_lab(slots=1)
    with net.call(ScriptedServer, ResearchPolicy(per_session=1)) as server:
        server.fail("too-long", 1)
        env = cli_env(cli, server.url, tmp_path / "home", bins)
        proc = agent_run(net, lab, env, "--agent", cli, "--max-experiments", "1", "--stall-seconds", "60")
        code, out, err = finish(proc, timeout=90)
    assert code == 0 and out == "max-experiments\n", err
    st = state(lab)
    assert st["sessions"][0]["end"] == "context" and st["sessions"][0]["exit_code"] == 1
    assert "context" in st["sessions"][0]["error"] or "too long" in st["sessions"][0]["error"].lower()
    prompt = (lab / ".nightlab" / "agent" / "prompt-2.md").read_text()
    assert "The previous session ended (context)" in prompt and "# Research journal" in prompt
    assert [r.answered for r in server.requests if r.turn == 0][:2] == ["too-long", "nightlab results --json"]
    assert server.problems == []


@pytest.mark.parametrize("cli", CLIS)
def test_a_stream_that_stalls_after_its_headers_ends_in_the_cli_or_at_the_watchdog(
    cli, make_lab, bins, net, tmp_path
):
    """The server answers 200 and `text/event-stream`, then sends nothing.

    Codex gives the stream up after its provider's `stream_idle_timeout_ms` (3 s here), retries
    and goes on in the same session: no watchdog kill, no restart. Claude Code 2.1.332 does not
    (measured: with `API_TIMEOUT_MS=3000` it still waited 60 s and more), so the supervisor's own
    watchdog kills it after `--stall-seconds` and the next session goes on.
    """
    lab = make_lab(slots=1)
    with net.call(ScriptedServer, ResearchPolicy(per_session=1)) as server:
        server.fail("stall", 1)
        env = cli_env(cli, server.url, tmp_path / "home", bins)
        env["API_TIMEOUT_MS"] = "3000"  # Claude Code's request timeout: it does not end this stall
        start = time.time()
        proc = agent_run(net, lab, env, "--agent", cli, "--max-experiments", "1", "--stall-seconds", "8")
        code, out, err = finish(proc, timeout=120)
    assert code == 0 and out == "max-experiments\n", err
    answered = [r.answered for r in server.requests]
    assert answered[0] == "stall" and "nightlab submit -m 'lr 0.02' --set LR=0.02 --json" in answered
    st = state(lab)
    ends = [s["end"] for s in st["sessions"]]
    if cli == "codex":
        assert "stall" not in ends and st["restarts_total"] == 0, ends
        assert len(ends) == 1  # recovered inside its session
    else:
        assert ends[0] == "stall" and "stall" not in ends[1:] and st["restarts_total"] == 1, ends
    assert time.time() - start < 60
    assert server.problems == []


@pytest.mark.parametrize("cli", CLIS)
def test_a_server_that_never_answers_is_met_by_the_watchdog(cli, make_lab, bins, net, tmp_path):
    lab = make_lab(slots=1)
    with net.call(ScriptedServer) as server:
        server.fail("silent", 10**6)
        env = cli_env(cli, server.url, tmp_path / "home", bins)
        # 6 s: long enough for the CLI to start and send its request on a loaded 2-core machine
        proc = agent_run(net, lab, env, "--agent", cli, "--stall-seconds", "6", "--max-hours", str(20 / 3600))
        agents: list[int] = []
        stdins: list[str] = []
        try:
            deadline = time.time() + 60
            while proc.poll() is None and time.time() < deadline:
                pid = state(lab).get("agent_pid")
                if pid and pid not in agents:
                    agents.append(pid)
                    with contextlib.suppress(FileNotFoundError):  # it may be gone already
                        stdins.append(os.readlink(f"/proc/{pid}/fd/0"))
                time.sleep(0.1)
            code, out, err = finish(proc, timeout=30)
        finally:
            stop(proc)
    assert code == 0 and out == "max-hours\n", err
    ends = [s["end"] for s in state(lab)["sessions"]]
    # stalled, killed and restarted until --max-hours (how many fit in 20 s depends on the load)
    assert len(ends) >= 2 and set(ends[:-1]) == {"stall"} and ends[-1] in ("stall", "max-hours")
    assert len(agents) >= 2 and all(dead_group(pid) for pid in agents)  # each killed with its group
    # stdin is the prompt file (read to EOF), never an open pipe or terminal
    assert stdins and all(re.search(r"/\.nightlab/agent/prompt-\d+\.md$", s) for s in stdins), stdins
    answered = [r.answered for r in server.requests]
    assert answered and set(answered) == {"silent"}


@pytest.mark.parametrize("cli", CLIS)
def test_max_cost_stops_the_agent_not_the_fleet(cli, make_lab, bins, net, tmp_path):
    lab = make_lab(slots=2)
    if cli == "codex":  # Codex reports tokens: priced so that one session costs a few dollars
        agent_toml(lab, "[agent.token_prices]\ninput = 100.0\ncached_input = 10.0\noutput = 100.0\n")
    slow = nightlab("submit", "-m", "slow", "--set", "SLEEP=4", cwd=lab).stdout.split()[0]
    # `submit` starts the controller in the background: wait until it has registered, or a
    # status taken while it is still starting reads "not running"
    controller = wait_until(
        lambda: (
            # running with a pid: while it starts, status says running before the pid is written
            (c := json.loads(nightlab("status", "--json", cwd=lab).stdout)["controller"])["pid"] and c
        ),
        timeout=30,
        interval=0.1,
        what="the controller that submit started",
    )
    with net.call(ScriptedServer, ResearchPolicy(per_session=1)) as server:
        env = cli_env(cli, server.url, tmp_path / "home", bins)
        proc = agent_run(net, lab, env, "--agent", cli, "--max-cost", "0.05", "--stall-seconds", "60")
        code, out, err = finish(proc, timeout=90)
    assert code == 0 and out == "max-cost\n", err
    st = state(lab)
    assert len(st["sessions"]) == 1 and st["cost_usd"] >= 0.05
    if cli == "codex":
        # enforced during the session, from the running token count in Codex's rollout file: the
        # session was stopped mid-turn ("max-cost"), not left to end its turn ("exit 0", where
        # Codex's transcript reports tokens). How many replies fit in the ~1 s poll depends on
        # the load (measured: 1 at load 20, 4 on a quiet box)
        [session] = st["sessions"]
        assert session["end"] == "max-cost" and session["exit_code"] is None, session
        assert session["input_tokens"] > 0 and session["cost_usd"] == st["cost_usd"]
    # the fleet was not stopped: the same controller runs on, and the queued experiment finishes
    after = json.loads(nightlab("status", "--json", cwd=lab).stdout)["controller"]
    assert controller["running"] and after["running"] and after["pid"] == controller["pid"]
    [done] = wait_json(lab, slow, timeout=60)
    assert done["status"] == "finished"
    text = nightlab("agent", "status", cwd=lab).stdout
    assert "stopped: max-cost" in text and "cap $0.05" in text
    nightlab("report", "--no-plot", cwd=lab)
    costs = (lab / "costs.md").read_text()
    assert "# Agent API cost" in costs and f"${st['cost_usd']:.2f}" in costs
    assert server.problems == []
