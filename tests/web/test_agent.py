"""The agent page: the supervisor's state (`nightlab agent status --json`) and the transcript tail.

Run: .venv/bin/python -m pytest -q tests/web/test_agent.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from nightlab.web._agent import TRANSCRIPT_LINES, agent_state


def _state(lab, **fields) -> None:
    agent = lab / ".nightlab" / "agent"
    agent.mkdir(parents=True, exist_ok=True)
    (agent / "state.json").write_text(
        json.dumps({"pid": 1, "status": "stopped", "agent": "claude", **fields})
    )


def test_no_agent_probes_nothing(tmp_path):
    (tmp_path / ".nightlab").mkdir()
    state = agent_state(tmp_path)
    assert not state["present"] and state["status"] is None and state["transcript_tail"] == []
    assert not (tmp_path / ".nightlab" / "agent").exists()  # read-only: no lock file, no directory


def test_state_is_the_cli_json_and_the_transcript_is_tailed(make_lab):
    lab = make_lab(slots=1)
    transcript = lab / ".nightlab" / "agent" / "transcript-3.log"
    _state(lab, session=3, transcript=str(transcript), experiments_submitted=7)
    transcript.write_text(
        "".join(f"line {i}\r\x1b[1mline {i}\x1b[0m\n" for i in range(TRANSCRIPT_LINES + 50))
    )
    state = agent_state(lab)
    cli = subprocess.run(
        [sys.executable, "-m", "nightlab", "agent", "status", "--json"],
        cwd=lab,
        capture_output=True,
        text=True,
    )
    assert state["present"] and state["status"] == json.loads(cli.stdout)
    assert state["status"]["running"] is False and state["status"]["status"] == "stopped"
    assert state["transcript_file"] == ".nightlab/agent/transcript-3.log"
    assert len(state["transcript_tail"]) == TRANSCRIPT_LINES
    assert state["transcript_tail"][-1] == f"line {TRANSCRIPT_LINES + 49}"  # \r and ANSI resolved


def test_dead_supervisor(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    _state(tmp_path, pid=int(proc.stdout), status="running", agent_pid=int(proc.stdout))
    state = agent_state(tmp_path)
    assert state["status"]["status"] == "dead" and not state["status"]["running"]
    assert state["status"]["agent_alive"] is False


def test_broken_state_does_not_break_the_page(tmp_path):
    agent = tmp_path / ".nightlab" / "agent"
    agent.mkdir(parents=True)
    (agent / "state.json").write_text('{"pid": 12')
    state = agent_state(tmp_path)
    assert state["present"] and "state.json" in state["error"]


def test_agent_page(make_lab):
    from fastapi.testclient import TestClient

    from nightlab.web.app import create_app

    lab = make_lab(slots=1)
    with TestClient(create_app(lab)) as c:
        assert "no agent running" in c.get("/agent").text
        assert c.get("/api/agent").json()["present"] is False
        transcript = lab / ".nightlab" / "agent" / "transcript-1.log"
        _state(lab, session=1, transcript=str(transcript), agent_pid=os.getpid())
        transcript.write_text("submitted e0001\nwaiting\n")
        html = c.get("/agent").text
    assert "no agent running" not in html and "submitted e0001" in html and "claude" in html


def test_agent_page_shows_an_outage_the_cost_and_the_sessions(make_lab):
    import time

    from fastapi.testclient import TestClient

    from nightlab.web.app import create_app

    lab = make_lab(slots=1)
    now = time.time()
    api = {
        "since": now - 300,
        "failures": 3,
        "delay": 120.0,
        "next_try_at": now + 60.4,
        "last_error": "API Error: 529",
    }
    session = {"n": 2, "started_at": now - 400, "ended_at": now - 390, "end": "api-error", "turns": 0}
    session |= {"commands": 0, "cost_usd": 0.0, "error": "API Error: 529 Overloaded"}
    _state(lab, session=2, api=api, cost_usd=1.25, limits={"max_cost": 5.0}, sessions=[session])
    state = agent_state(lab)
    assert state["outage"].startswith("API unavailable since ") and ", next try at " in state["outage"]
    assert "(in 60 s); 3 failed sessions, last error: API Error: 529" in state["outage"]
    assert state["cost"] == "API $1.25 this run, $0.00 last session, cap $5.00, GPU - (fleet)"
    assert state["sessions"] == [
        "session 2: api-error after 10 s, 0 turns, 0 commands, $0.00; API Error: 529 Overloaded"
    ]
    with TestClient(create_app(lab)) as c:
        html = c.get("/agent").text
    assert 'id="agent-outage"' in html and "API unavailable since" in html and "cap $5.00" in html
    assert "session 2: api-error after 10 s" in html
