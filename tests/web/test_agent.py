"""The agent page reads `.nightlab/agent/` defensively (`nightlab.web._agent`).

Run: .venv/bin/python -m pytest -q tests/web/test_agent.py
"""

from __future__ import annotations

import json
import os

from nightlab.web._agent import TRANSCRIPT_LINES, agent_state


def test_no_agent(tmp_path):
    state = agent_state(tmp_path)
    assert not state["present"] and not state["running"] and state["transcript_tail"] == []


def test_state_and_transcript_tail(tmp_path):
    agent = tmp_path / ".nightlab" / "agent"
    agent.mkdir(parents=True)
    (agent / "state.json").write_text(json.dumps({"pid": os.getpid(), "state": "running", "restarts": 2}))
    (agent / "transcript.jsonl").write_text("".join(f'{{"n": {i}}}\n' for i in range(TRANSCRIPT_LINES + 50)))
    state = agent_state(tmp_path)
    assert state["present"] and state["running"] and state["pid_alive"]
    assert state["state"]["restarts"] == 2
    assert len(state["transcript_tail"]) == TRANSCRIPT_LINES
    assert state["transcript_tail"][-1] == f'{{"n": {TRANSCRIPT_LINES + 49}}}'


def test_dead_pid_is_not_running(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    agent = tmp_path / ".nightlab" / "agent"
    agent.mkdir(parents=True)
    (agent / "state.json").write_text(json.dumps({"pid": int(proc.stdout), "state": "running"}))
    state = agent_state(tmp_path)
    assert state["present"] and state["pid_alive"] is False and not state["running"]


def test_half_written_state_does_not_break_the_page(tmp_path):
    agent = tmp_path / ".nightlab" / "agent"
    agent.mkdir(parents=True)
    (agent / "state.json").write_text('{"pid": 12')
    state = agent_state(tmp_path)
    assert state["present"] and state["state"] is None and "state.json" in state["state_error"]


def test_agent_page(make_lab):
    from fastapi.testclient import TestClient

    from nightlab.web.app import create_app

    lab = make_lab(slots=1)
    with TestClient(create_app(lab)) as c:
        assert "no agent running" in c.get("/agent").text
        assert c.get("/api/agent").json()["present"] is False
        agent = lab / ".nightlab" / "agent"
        agent.mkdir(parents=True)
        (agent / "state.json").write_text(json.dumps({"state": "running", "pid": os.getpid(), "model": "m1"}))
        (agent / "transcript.log").write_text("submitted e0001\nwaiting\n")
        html = c.get("/agent").text
    assert "no agent running" not in html and "submitted e0001" in html and "m1" in html
