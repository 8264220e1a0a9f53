"""`nightlab demo` end to end on a tiny budget: every stage runs for real on the cpu profile."""

from __future__ import annotations

import json

import pytest

from labkit import nightlab
from nightlab.ledger import open_ledger


def test_demo_runs_every_stage_and_replaces_its_own_lab(tmp_path, monkeypatch):
    monkeypatch.setenv("NIGHTLAB_DATA_DIR", str(tmp_path / "data"))
    args = ("demo", "--dir", "demo-lab", "--budget", "2", "--space", "MATRIX_LR=0.04,0.0004", "--json")
    proc = nightlab(*args, cwd=tmp_path, timeout=600)
    out = json.loads(proc.stdout)
    lab = tmp_path / "demo-lab"
    assert out["lab"] == str(lab)
    assert out["verdict"] in ("keep", "discard", "within-noise")
    assert out["adopted"] == (out["verdict"] == "keep")
    for stage in ("[1/6]", "[3/6]", "[4/6]", "[6/6]"):
        assert stage in proc.stderr
    rows = (lab / "results.tsv").read_text().splitlines()
    assert rows[0].startswith("commit\tval_bpb")
    assert sum(1 for r in rows[1:] if r.split("\t")[3] == "keep") >= 2  # the two baseline runs
    res = json.loads(nightlab("results", "--all", "--json", cwd=lab).stdout)
    assert {e["outcome"] for e in res["experiments"]} == {"ok"}
    # what the demo printed is what the ledger holds: the best variant's verdict and figure
    best = next(e for e in res["experiments"] if e["id"] == out["best_id"])
    assert best["verdict"] == out["verdict"]
    with open_ledger(lab) as ledger:
        tree = ledger.get(best["id"]).tree
        same = [e.metric("val_bpb") for e in ledger.experiments(tree=tree, tier=best["tier"])]
    assert out["best_runs"] == len(same) and out["best"] == pytest.approx(sum(same) / len(same))
    status = json.loads(nightlab("status", "--json", cwd=lab).stdout)
    assert not status["controller"]["running"]  # the demo leaves no fleet behind
    # a second demo replaces the lab it made; a directory it did not make is refused
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    refused = nightlab("demo", "--dir", "mine", cwd=tmp_path, check=False)
    assert refused.returncode == 2 and "was not made by `nightlab demo`" in refused.stderr
    assert (tmp_path / "mine" / "notes.txt").exists()
