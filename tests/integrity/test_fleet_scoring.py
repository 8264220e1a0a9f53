"""The controller's side: built-in-target runs go through the supervisor; every view says who vouches.

One real fleet run of the built-in target (cpu profile, 5 s budget): the ledger's figures are
the scorer's (`scored_by: harness`, the sandbox named), `results` / `show` mark it `harness` (or
`unsandboxed`); a foreign target's results are `self-reported` in the same views.
Run: .venv/bin/python -m pytest -q tests/integrity/test_fleet_scoring.py (~1-2 min on the 2-core box)
"""

from __future__ import annotations

import json

from redteam import SANDBOXED

from labkit import nightlab, wait_json


def test_a_builtin_run_is_scored_by_the_harness_and_marked_so(tmp_path, monkeypatch):
    monkeypatch.setenv("NIGHTLAB_DATA_DIR", str(tmp_path / "data"))
    nightlab("init", "lab", "--profile", "cpu", "--budget", "5", cwd=tmp_path)
    lab = tmp_path / "lab"
    nightlab("prepare", cwd=lab, timeout=300)
    try:
        eid = json.loads(nightlab("submit", "-m", "baseline", "--json", cwd=lab).stdout)[0]["id"]
        [done] = wait_json(lab, eid, timeout=400)
    finally:
        nightlab("fleet", "stop", cwd=lab, check=False)
    shown = json.loads(nightlab("show", eid, "--json", cwd=lab).stdout)
    assert done["outcome"] == "ok", shown["detail"]
    metrics = shown["metrics"]
    assert metrics["scored_by"] == "harness" and metrics["probe_rows"] >= 1
    assert metrics["sandbox"] == ("bwrap" if SANDBOXED else "none")
    assert metrics["train_wall_seconds"] <= metrics["wall_limit_seconds"]
    expected = "harness" if SANDBOXED else "unsandboxed"
    assert shown["trust"] == expected
    [row] = json.loads(nightlab("results", "--all", "--json", cwd=lab).stdout)["experiments"]
    assert row["trust"] == expected and row["val_bpb"] == metrics["val_bpb"]
    assert f"trust {expected}:" in nightlab("show", eid, "--no-diff", cwd=lab).stdout
    assert (lab / ".nightlab" / "harness-digests.json").exists()


def test_a_foreign_targets_results_are_self_reported(make_lab):
    lab = make_lab()
    try:
        eid = json.loads(nightlab("submit", "-m", "base", "--json", cwd=lab).stdout)[0]["id"]
        wait_json(lab, eid)
    finally:
        nightlab("fleet", "stop", cwd=lab, check=False)
    payload = json.loads(nightlab("results", "--json", cwd=lab).stdout)
    assert payload["self_reported"] is True
    assert [e["trust"] for e in payload["experiments"]] == ["self-reported"]
    text = nightlab("results", cwd=lab)
    assert "self-reported" in text.stdout and "self-reported:" in text.stderr
    assert json.loads(nightlab("show", eid, "--json", cwd=lab).stdout)["trust"] == "self-reported"
    report = nightlab("report", "--wide", cwd=lab)
    assert "not vouched for by the harness: 1 self-reported" in report.stderr
    header, row = (lab / "results-wide.tsv").read_text().splitlines()[:2]
    assert row.split("\t")[header.split("\t").index("trust")] == "self-reported"
