"""Descriptions, diffs, knob values, logs and agent transcripts are shown as text, never as markup.

The session lab holds an experiment whose description and MODE knob are
`<script>...</script><img onerror=...>`, and a running experiment whose log prints it.
Run: .venv/bin/python -m pytest -q tests/web/test_xss.py
"""

from __future__ import annotations

import json

from nightlab.web.app import create_app

RAW = ("<script>window.__xss", "<img src=x")


def _assert_escaped(html: str, where: str) -> None:
    for raw in RAW:
        assert raw not in html, where
    assert "&lt;script&gt;window.__xss" in html, where


def test_description_diff_and_knob_are_escaped(night_lab, client):
    xss = night_lab.ids["xss"]
    page = client.get(f"/experiments/{xss}").text
    _assert_escaped(page, "experiment page")
    # description (title), the knob value (params) and the diff each carry it
    assert page.count("window.__xss = 1") >= 3
    _assert_escaped(client.get("/").text, "overview leaderboard")
    _assert_escaped(client.get(f"/experiments/{night_lab.ids['baseline']}").text, "children table")


def test_live_log_line_and_log_tail_are_escaped(night_lab, client):
    _assert_escaped(client.get("/fleet").text, "fleet loss line")
    _assert_escaped(client.get(f"/experiments/{night_lab.ids['running']}").text, "log tail")


def test_json_endpoints_carry_the_text_unchanged(night_lab, client):
    data = client.get(f"/api/experiments/{night_lab.ids['xss']}").json()
    assert "<script>window.__xss = 1</script>" in data["description"]
    assert client.get("/api/overview").headers["content-type"].startswith("application/json")


def test_agent_state_and_transcript_are_escaped(make_lab):
    from fastapi.testclient import TestClient

    lab = make_lab(slots=1)
    agent = lab / ".nightlab" / "agent"
    agent.mkdir(parents=True)
    (agent / "state.json").write_text(
        json.dumps({"pid": 1, "status": "stopped", "agent": "<script>window.__xss=3</script>"})
    )
    (agent / "transcript-1.log").write_text("thinking\n<img src=x onerror=alert(1)>\n")
    with TestClient(create_app(lab)) as c:
        html = c.get("/agent").text
    assert "<script>window.__xss" not in html and "<img src=x" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_every_response_forbids_inline_scripts(client):
    csp = client.get("/").headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
