"""`nightlab demo` end to end on a short budget: every stage runs for real on the cpu profile, and
the demo's question has a real answer (the carried-over batch regime loses beyond the noise)."""

from __future__ import annotations

import json
import re

import pytest
from matplotlib.axes import Axes

from labkit import nightlab
from nightlab.config import load_config
from nightlab.ledger import open_ledger
from nightlab.report import progress_png


def test_demo_finds_the_batch_regime_that_suits_this_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("NIGHTLAB_DATA_DIR", str(tmp_path / "data"))
    # the default question on a shorter budget: the carried-over 2**13 tokens per step against 2**11 / 2**12
    proc = nightlab("demo", "--dir", "demo-lab", "--budget", "10", "--json", cwd=tmp_path, timeout=900)
    out = json.loads(proc.stdout)
    lab = tmp_path / "demo-lab"
    assert out["lab"] == str(lab)
    for stage in ("[1/6]", "[3/6]", "[4/6]", "[6/6]"):
        assert stage in proc.stderr
    # the find: a smaller total batch wins beyond the noise and is adopted
    assert out["verdict"] == "keep" and out["adopted"], out["story"]
    assert out["best"] < out["baseline"] and out["z"] > out["z_needed"]
    assert out["margin_sd"] is not None and out["margin_sd"] > out["z_needed"]
    assert "-TOTAL_BATCH_SIZE = 2**13" in out["diff"]
    assert re.search(r"^\+TOTAL_BATCH_SIZE = 2\*\*1[12]\b", out["diff"], re.M)
    assert "TOTAL_BATCH_SIZE = 2**13" not in (lab / "train.py").read_text()
    # the story: each variant's mean ± sd, the winner's margin, the diff, where to look next
    story = "\n".join(out["story"])
    assert {v["knobs"]["TOTAL_BATCH_SIZE"] for v in out["variants"]} == {"2**11", "2**12"}
    assert f"what won: {out['best_id']} by " in story and "noise sd" in story and ": `keep`" in story
    assert "+TOTAL_BATCH_SIZE = 2**1" in story and "http://127.0.0.1:8350/" in story
    assert "progress.png" in story and (lab / "progress.png").stat().st_size > 0
    rows = (lab / "results.tsv").read_text().splitlines()
    assert rows[0].startswith("commit\tval_bpb")
    assert (
        sum(1 for r in rows[1:] if r.split("\t")[3] == "keep") >= 3
    )  # the baseline's two runs and the winner
    res = json.loads(nightlab("results", "--all", "--json", cwd=lab).stdout)
    # a run a busy machine starved is `degraded` and re-run; the demo waits for every re-run
    assert {e["outcome"] for e in res["experiments"]} <= {"ok", "degraded"}
    assert not [e["id"] for e in res["experiments"] if e["status"] in ("queued", "running")]
    # what the demo printed is what the ledger holds: the best variant's figure
    best = next(e for e in res["experiments"] if e["id"] == out["best_id"])
    with open_ledger(lab) as ledger:
        tree = ledger.get(best["id"]).tree
        same = [e.metric("val_bpb") for e in ledger.experiments(tree=tree, tier=best["tier"])]
    assert out["best_runs"] == len(same) and out["best"] == pytest.approx(sum(same) / len(same))
    # progress.png labels the baseline and the kept change, not a variant that was not adopted
    labels = []
    monkeypatch.setattr(Axes, "annotate", lambda self, text, *a, **k: labels.append(text))
    with open_ledger(lab) as ledger:
        progress_png(ledger, load_config(lab / "nightlab.toml"), tmp_path / "progress.png")
    kept = next(e for e in res["experiments"] if e["id"] == out["best_id"])
    assert labels == ["baseline", f"kept {out['best_id']}: {kept['description']}"]
    status = json.loads(nightlab("status", "--json", cwd=lab).stdout)
    assert not status["controller"]["running"]  # the demo leaves no fleet behind
    # a second demo replaces the lab it made; a directory it did not make is refused
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    refused = nightlab("demo", "--dir", "mine", cwd=tmp_path, check=False)
    assert refused.returncode == 2 and "was not made by `nightlab demo`" in refused.stderr
    assert (tmp_path / "mine" / "notes.txt").exists()
