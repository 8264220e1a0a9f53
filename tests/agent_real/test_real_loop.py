"""The real Claude Code and Codex CLIs run a research loop in a lab, driven by a scripted model.

The scripted server (scripted_server.py) plays a researcher through each CLI's real shell
tool; `nightlab agent run` supervises the real CLI; the lab runs the synthetic target. What
is checked is what a night needs: experiments submitted and one adopted through the real
tool calls, the transcript read back (`agent status`), the journal updated, the agent that
ends its turn restarted within the limits, and the cost each CLI reports.

Run: .venv/bin/python -m pytest -q tests/agent_real   (installs the pinned CLIs with npm once)
"""

from __future__ import annotations

import json
import os

import pytest
from real_support import CLIS, agent_run, cli_env, finish, state
from scripted_server import CHARS_PER_TOKEN, REQUIRED_STATE, ResearchPolicy, ScriptedServer

from labkit import nightlab, wait_json
from nightlab.agent.prompt import PROMPT_TOKEN_BUDGET

CLI_OWN_TOKENS = 16_000  # a new CLI version that sends much more than this deserves a look


@pytest.mark.parametrize("cli", CLIS)
def test_a_real_research_loop(cli, make_lab, bins, net, tmp_path):
    lab = make_lab(slots=2)
    nightlab("submit", "-m", "baseline", "--repeats", "2", cwd=lab)
    nightlab("submit", "-m", "blow up", "--set", "MODE='oom'", cwd=lab)
    wait_json(lab, "--all")
    # every session's first request must show the lab's state, the crash included
    required = (*REQUIRED_STATE, "## Recent crashes", "- e0003 crash:oom")
    # two runs an idea: a keep needs each side's own spread (search/decide.py MIN_RUNS_TO_KEEP)
    policy = ResearchPolicy(per_session=2, repeats=2)
    with net.call(ScriptedServer, policy, required=required) as server:
        env = cli_env(cli, server.url, tmp_path / "home", bins)
        proc = agent_run(net, lab, env, "--agent", cli, "--max-experiments", "8", "--stall-seconds", "60")
        code, out, err = finish(proc, timeout=120)
    assert code == 0, err
    assert out == "max-experiments\n", err
    assert server.problems == []
    st = state(lab)
    # session 1 ran the whole policy and ended its turn saying it was done: restarted (exit 0)
    first = st["sessions"][0]
    assert first["end"] == "exit 0" and first["exit_code"] == 0
    assert first["commands"] == 7 and first["turns"] >= 7
    assert first["last_message"].startswith("I am done")
    assert len(st["sessions"]) == 2 and st["restarts_total"] == 1
    assert st["experiments_submitted"] == 8

    # the real tool calls did the research: 4 ideas of 2 runs by the agent, lr 0.02 adopted
    rows = json.loads(nightlab("results", "--json", cwd=lab).stdout)["experiments"]
    by_agent = sorted((r["id"], r["description"]) for r in rows if r["description"].startswith("lr "))
    assert by_agent == [
        ("e0004", "lr 0.02"),
        ("e0005", "lr 0.02"),
        ("e0006", "lr 0.04"),
        ("e0007", "lr 0.04"),
        ("e0008", "lr 0.005"),
        ("e0009", "lr 0.005"),
        ("e0010", "lr 0.03"),
        ("e0011", "lr 0.03"),
    ]
    journal = nightlab("journal", cwd=lab).stdout
    assert "- e0004+1 keep [adopted]: cpu 1.000000" in journal and "LR 0.01->0.02" in journal
    assert "LR 0.01->0.04" in journal
    # session 1's note, then session 2's if it got that far before the stop at 8 experiments.
    # Compared as a list: the notes start with "- ", which in pytest's diff of two strings reads
    # as a removed line (that is how "only session 2's note" was once read off a CI failure).
    notes = (lab / "notes.md").read_text().splitlines()
    assert notes in (
        ["- session tried e0004, e0005, e0006, e0007"],
        ["- session tried e0004, e0005, e0006, e0007", "- session tried e0008, e0009, e0010, e0011"],
    )

    # the restarted session's prompt held the new state (the server checked every first request)
    prompt2 = (lab / ".nightlab" / "agent" / "prompt-2.md").read_text()
    assert "The previous session ended (exit 0)" in prompt2 and "adopt e0004: lr 0.02" in prompt2
    firsts = [r for r in server.requests if r.turn == 0]
    assert len(firsts) == 2 and "adopt e0004: lr 0.02" in firsts[1].prompt
    assert max(len(r.prompt) for r in firsts) <= PROMPT_TOKEN_BUDGET * CHARS_PER_TOKEN
    # what the model reads first: our prompt plus the CLI's own system prompt and tools
    # (measured: Claude Code ~12.5k tokens of its own, Codex ~10k)
    assert max(r.prompt_chars for r in firsts) <= (PROMPT_TOKEN_BUDGET + CLI_OWN_TOKENS) * CHARS_PER_TOKEN

    # the transcript, read back: status shows each session's end, turns, commands, cost, last words
    transcript = (lab / ".nightlab" / "agent" / "transcript-1.log").read_text()
    assert "nightlab adopt e0004" in transcript
    text = nightlab("agent", "status", cwd=lab).stdout
    assert "stopped: max-experiments" in text
    assert "session 1: exit 0 after" in text and "7 commands" in text and "I am done" in text

    # cost: Claude Code reports total_cost_usd; Codex reports tokens, priced by agent.token_prices
    assert first["cost_usd"] > 0 and st["cost_usd"] >= first["cost_usd"]
    if cli == "codex":
        fresh = first["input_tokens"] - first["cached_input_tokens"]
        expected = (fresh * 1.25 + first["cached_input_tokens"] * 0.125 + first["output_tokens"] * 10.0) / 1e6
        assert first["cost_usd"] == pytest.approx(expected)
    assert f"API ${st['cost_usd']:.2f} this run" in text and "GPU - (fleet)" in text
    if os.geteuid() == 0 and cli == "claude":  # the unattended line works as root
        assert "running as root: IS_SANDBOX=1 set for Claude Code's unattended line" in err
