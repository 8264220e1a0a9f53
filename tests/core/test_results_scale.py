"""`nightlab results` and the dashboard overview decode only the rows they show (issue 16).

At 20,000 experiments decoding every row (JSON params, health, judged, every metric) cost ~1 s
of CPU per listing. Ranking now reads a dozen columns and one metric per experiment
(`ledger.rank_keys`), and only the rows a listing shows are decoded. These tests count the
decodes and read the SQL SQLite runs, so they fail if a listing goes back to reading it all;
the ranking itself is checked against the plain full-decode reference it replaced.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from nightlab import identity
from nightlab.analysis import figure, ok_values, ranking, results
from nightlab.config import load_lab_config
from nightlab.ledger import NewExperiment, open_ledger
from nightlab.ledger import _base as ledger_base
from nightlab.testing import reliability as rel

N = 120


@pytest.fixture(scope="module")
def big_lab(tmp_path_factory):
    """A lab of N finished/queued experiments of mixed outcomes, made through the ledger API."""
    lab = rel.make_fast_lab(tmp_path_factory.mktemp("scale"), slots=2)
    [first] = rel.submit_many(lab, 1)
    epoch = identity.epoch_key(load_lab_config(lab).config)
    with open_ledger(lab) as ledger:
        e = ledger.get(first)
        other = NewExperiment(
            snapshot=e.snapshot, identity="other-identity", parent=None, description="x", tier="cpu", seed=0
        )
        new = [
            NewExperiment(
                snapshot=e.snapshot,
                identity=e.identity if i % 3 else "other-identity",
                parent=None,
                description=f"run {i}",
                tier="cpu",
                seed=i + 1,
                params={"LR": str(i)},
                epoch=epoch if i % 7 else "",  # every 7th of an earlier epoch: never compared
            )
            for i in range(N)
        ]
        ledger.add_experiments(new)
        ledger.add_experiments([other])  # stays queued
        for i in range(N):
            attempt = ledger.lease_next("cpu-0", "cpu")
            outcome = "crash:exception" if i % 10 == 0 else "degraded" if i % 17 == 0 else "ok"
            ledger.finish_attempt(
                attempt.id,
                outcome=outcome,
                metrics={"val_bpb": 1.0 + (i * 37 % 101) / 1000, "training_seconds": 1.0, "note": "text"},
                verdict="within-noise" if i == 5 else "discard",
                judged={
                    "incumbent": "abc",
                    "identity": "old-identity" if i % 4 == 0 else e.identity,
                    "mean": 1.0,
                    "n": 2,
                },
                health={"reason": "cpu starved"} if outcome == "degraded" else None,
            )
    yield lab
    rel.stop_lab(lab)


@pytest.fixture
def decodes(monkeypatch):
    """How many experiment rows the ledger decodes (every full read goes through `_to_experiment`)."""
    seen: list[str] = []
    real = ledger_base._to_experiment

    def counting(row, metrics=None):
        seen.append(row["id"])
        return real(row, metrics)

    monkeypatch.setattr(ledger_base, "_to_experiment", counting)
    return seen


def _cli(lab, *args: str) -> str:
    from nightlab.cli import main

    out, code = io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            main([*args, "--lab", str(lab)])
        except SystemExit as e:
            code = e.code
    assert code in (0, None), out.getvalue()
    return out.getvalue()


def _reference(ledger, config, lab):
    """The full-decode ranking `analysis.results` used before `rank_keys` (the plain reference)."""
    metric = config.metric.name
    exps = ledger.experiments()
    head_identity = identity.of(lab, "HEAD")
    incumbents = {
        t: figure(ok_values([e for e in exps if e.identity == head_identity and e.tier == t], metric))
        for t in {e.tier for e in exps}
    }
    current = identity.epoch_key(config)
    rows = []
    for e in exps:
        value = e.metric(metric) if e.ok else None
        inc = incumbents.get(e.tier)
        comparable = value is not None and inc is not None and e.epoch == current
        earlier = bool(e.judged) and e.judged.get("identity") != head_identity and e.identity != head_identity
        rows.append(
            (
                e.id,
                value,
                value - inc.mean if comparable else None,
                earlier,
                e.ok and e.identity == head_identity,
                e.seq,
            )
        )
    sign = 1 if config.metric.lower_is_better else -1
    ok = sorted((r for r in rows if r[1] is not None), key=lambda r: (sign * r[1], r[5]))
    rest = sorted((r for r in rows if r[1] is None), key=lambda r: -r[5])
    return [r[:5] for r in ok + rest], incumbents


def test_the_ranking_matches_the_full_decode_reference(big_lab):
    config = load_lab_config(big_lab).config
    with open_ledger(big_lab) as ledger:
        ranked, incumbents = ranking(ledger, config, big_lab)
        want, want_incumbents = _reference(ledger, config, big_lab)
        # the full listing ranks the rows it decoded anyway: the same ranking from them
        assert ranking(ledger, config, big_lab, experiments=ledger.experiments()) == (ranked, incumbents)
    got = [(r.key.id, r.value, r.delta, r.earlier_incumbent, r.incumbent) for r in ranked]
    assert got == want
    assert incumbents == want_incumbents
    assert any(r.earlier_incumbent for r in ranked) and any(r.delta is not None for r in ranked)


def test_ranking_decodes_no_row_and_reads_no_json_column(big_lab, decodes):
    config = load_lab_config(big_lab).config
    statements: list[str] = []
    with open_ledger(big_lab) as ledger:
        ledger._conn.set_trace_callback(statements.append)
        ranked, _ = ranking(ledger, config, big_lab)
    assert len(ranked) == N + 2 and decodes == []
    reads = [s for s in statements if "experiments" in s]
    assert reads and not any("SELECT *" in s or "SELECT e.*" in s for s in reads)
    # one metric per experiment, by key: never the whole metrics table
    assert all("m.key = " in s for s in statements if "metrics" in s)
    for column in ("params", "health", "detail", "metrics m ON m.experiment_id = e.id WHERE"):
        assert not any(column in s for s in reads), column


def test_the_table_decodes_only_the_rows_it_shows(big_lab, decodes):
    out = _cli(big_lab, "results", "-n", "7")
    assert len(decodes) == 7  # the footnotes (degraded runs, settle hints) are of the rows shown only
    assert sum(1 for line in out.splitlines() if line.startswith("e0")) == 7


def test_json_lists_every_experiment_unless_n_is_given(big_lab, decodes):
    full = json.loads(_cli(big_lab, "results", "--json"))
    assert full["total"] == len(full["experiments"]) == N + 2
    decodes.clear()
    top = json.loads(_cli(big_lab, "results", "--json", "-n", "3"))
    assert top["total"] == N + 2 and len(decodes) == 3
    assert top["experiments"] == full["experiments"][:3]
    assert {k: v for k, v in top.items() if k != "experiments"} == {
        k: v for k, v in full.items() if k != "experiments"
    }


def test_the_overview_decodes_only_its_leaderboard_and_crashes(big_lab, decodes):
    from nightlab.web import _views
    from nightlab.web._readonly import ReadOnlyLab

    with ReadOnlyLab(big_lab) as lab:
        data = _views.overview(lab)
    assert len(data["leaderboard"]) == _views.LEADERBOARD_ROWS
    assert len(data["recent_crashes"]) == _views.RECENT_CRASHES
    assert len(decodes) == _views.LEADERBOARD_ROWS + _views.RECENT_CRASHES
    assert data["counts"]["queued"] == 2 and data["counts"]["done"] == N
    with ReadOnlyLab(big_lab) as lab:
        rows, _ = results(lab.ledger, lab.config, lab.path)
    best = [r for r in rows if r.value is not None][: _views.LEADERBOARD_ROWS]
    assert [r["id"] for r in data["leaderboard"]] == [r.experiment.id for r in best]


def test_the_fast_decoder_builds_the_same_experiment_as_the_constructor(big_lab):
    from dataclasses import fields

    from nightlab.ledger import Experiment

    with open_ledger(big_lab) as ledger:
        decoded = ledger.experiments()
    assert decoded
    names = {f.name for f in fields(Experiment)}
    for e in decoded:
        assert set(vars(e)) == names  # every field set, a new one cannot be forgotten
        assert e == Experiment(**{n: getattr(e, n) for n in names})


def test_the_progress_chart_decodes_no_row(big_lab, decodes):
    from nightlab.web import _views
    from nightlab.web._readonly import ReadOnlyLab

    with ReadOnlyLab(big_lab) as lab:
        series = _views.progress_series(lab)
        rows, _ = results(lab.ledger, lab.config, lab.path)
    ok = [r for r in rows if r.experiment.ok and r.experiment.finished_at is not None]
    assert [p["id"] for p in series["points"]] == [
        r.experiment.id for r in sorted(ok, key=lambda r: (r.experiment.finished_at, r.experiment.seq))
    ]
    assert all(p["description"].startswith("run ") for p in series["points"])
    decodes.clear()
    with ReadOnlyLab(big_lab) as lab:
        _views.progress_series(lab)
    assert decodes == []


def test_the_full_document_is_built_without_a_garbage_collection(big_lab, monkeypatch):
    """Decoding and building every row creates thousands of acyclic objects: the cyclic
    collector stays paused (it was a third of the CPU time at 20,000 experiments)."""
    import gc

    from nightlab.lab import Lab
    from nightlab.views import every_result_payload

    runs: list[str] = []

    def seen(phase: str, info: dict) -> None:
        if phase == "start":
            runs.append(info["generation"])

    with Lab.open(big_lab) as lab:
        every_result_payload(lab)  # imports, caches: what a second listing no longer does
        gc.collect()
        threshold = gc.get_threshold()
        gc.set_threshold(50)  # a collection every 50 new objects: hundreds while building 122 rows
        gc.callbacks.append(seen)
        try:
            doc = every_result_payload(lab)
        finally:
            gc.callbacks.remove(seen)
            gc.set_threshold(*threshold)
    # at most the one deferred collection, when the collector comes back at the end
    assert doc["total"] == N + 2 and len(runs) <= 1
    assert gc.isenabled()


def test_the_dashboard_keeps_the_encoded_full_document_while_the_lab_is_unchanged(big_lab, decodes):
    from fastapi.testclient import TestClient

    from nightlab.web import create_app

    with TestClient(create_app(big_lab)) as client:
        first = client.get("/api/results")
        assert first.status_code == 200 and len(decodes) >= N + 2
        decodes.clear()
        again = client.get("/api/results")
        assert again.content == first.content and decodes == []
        with open_ledger(big_lab) as ledger:
            ledger.log_event("test")  # a new ledger version: the document is rebuilt
        assert client.get("/api/results").status_code == 200 and len(decodes) >= N + 2
    assert first.json() == json.loads(_cli(big_lab, "results", "--json"))
