"""bench/rung_fidelity.py's analysis, on made-up rows with known answers: the rank correlations per
budget pair (through `nightlab.rungs.rank_transfer`), the short-horizon bias, the LR optimum, the
pooled noise, the wall-time fit and the `Fidelity` parameters it derives. Runs nothing."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import rung_fidelity as rf  # noqa: E402

FRACTIONS = (0.1, 1 / 3, 1.0)
FIXED = 40.0  # made-up start-up and scoring seconds: a run's wall = FIXED + its training seconds


def opt(f: float) -> float:
    """The made-up LR optimum (log10 of the scale) at budget fraction f: higher when shorter."""
    return 0.2 + 0.3 * (1 - f)


def value(c: rf.Config, f: float) -> float:
    # quadratic in log10 LR around opt(f); depth 3 costs 0.05 more per unit of (1 - f); batch 2**13
    # 0.01 more, plus 0.02 per unit of (1 - f)
    return (
        1.0
        + (math.log10(c.lr) - opt(f)) ** 2
        + (0.05 * (1 - f) if c.depth == 3 else 0.0)
        + (0.01 + 0.02 * (1 - f) if c.batch == 2**13 else 0.0)
    )


def made_up_rows(noise: float = 0.002) -> list[dict]:
    rows = []
    for c in rf.GRID:
        for f in FRACTIONS:
            for seed, e in zip((0, 1, 2), (-noise, 0.0, noise), strict=True):
                budget = 30 * f
                rows.append(
                    {
                        "key": rf.key(c.name, f, seed),
                        "config": c.name,
                        "lr": c.lr,
                        "depth": c.depth,
                        "batch": c.batch,
                        "fraction": f,
                        "budget": budget,
                        "seed": seed,
                        "val_bpb": value(c, f) + e * (1 + (1 - f)),  # noisier short
                        "steps": 200 * f if c.depth == 2 else 50 * f,  # depth 3: 4x the work a step
                        "training_seconds": budget,
                        "wall": FIXED + budget,
                        "load_start": 1.0,
                        "load_end": 2.0,
                    }
                )
    return rows


def test_the_grid_has_twelve_configs_over_lr_batch_and_depth_and_the_plan_is_stable() -> None:
    assert len(rf.GRID) == 12 and len({c.name for c in rf.GRID}) == 12
    assert {c.lr for c in rf.GRID} == set(rf.LR_SCALES) and {c.depth for c in rf.GRID} == {2, 3}
    knobs = rf.Config(3.0, 3, 2**13).knobs()
    assert knobs["MATRIX_LR"] == "0.12" and knobs["DEPTH"] == "3" and knobs["TOTAL_BATCH_SIZE"] == "2**13"
    a = rf.plan(rf.GRID, FRACTIONS, (0, 1, 2))
    assert a == rf.plan(rf.GRID, FRACTIONS, (0, 1, 2)) and len(a) == len(set(a)) == 108
    assert [t[2] for t in a] == sorted(
        t[2] for t in a
    )  # seed by seed: a grid stopped early holds whole seeds
    block = a[:36]
    assert block != sorted(block, key=lambda t: (t[0].name, t[1]))  # shuffled: load drift is not a bias


def test_rank_correlations_per_budget_pair_come_from_rank_transfer() -> None:
    a = rf.analyse(made_up_rows())
    pairs = {(c["short"], c["long"]): c for c in a["correlations"]}  # fractions to 4 decimals
    assert set(pairs) == {(0.1, 0.3333), (0.1, 1.0), (0.3333, 1.0)}
    m = rf.means(made_up_rows())
    for c in a["correlations"]:
        common = sorted(set(m[c["short"]]) & set(m[c["long"]]))
        want = rf.rank_transfer([(m[c["short"]][k], m[c["long"]][k]) for k in common])
        assert c["rho"] == pytest.approx(want["rho"]) and c["n"] == 12
        assert c["interval"][0] <= c["rho"] <= c["interval"][1] + 1e-6
    assert (
        pairs[(0.1, 0.3333)]["rho"] > pairs[(0.1, 1.0)]["rho"]
    )  # the short rungs agree more with each other


def test_the_short_horizon_bias_says_high_learning_rates_rank_better_short() -> None:
    a = rf.analyse(made_up_rows())
    shifts = a["bias"]["levels"]["0.1"]["lr"]
    assert shifts["3"] < 0 < shifts["1"] and shifts["0.333333"] == 0  # the high LR ranks better short
    assert a["bias"]["levels"]["0.1"]["depth"]["3"] > 0  # the deeper model ranks worse short
    assert a["lr_optimum_log10"]["1"] == pytest.approx(opt(1.0))
    assert a["lr_optimum_log10"]["0.1"] == pytest.approx(opt(0.1))
    # every config's shift is its rank short minus its rank full, and the shifts sum to zero
    assert sum(a["bias"]["configs"]["0.1"].values()) == pytest.approx(0.0)


def test_noise_costs_and_the_fidelity_parameters() -> None:
    rows = made_up_rows()
    rows.append({**rows[0], "key": "x", "val_bpb": None, "status": "invalid"})  # a failed run counts nowhere
    rows.append({**rows[0], "key": "y", "val_bpb": 9.0, "degraded": True})  # nor does a starved one
    a = rf.analyse(rows)
    assert a["failed"] == ["x"] and a["degraded"] == ["y"] and a["ok"] == 108
    # seeds at -e, 0, +e: pooled sd = e * (1 + (1 - f)) with 2 degrees of freedom per config
    assert a["noise_sd"]["1"] == pytest.approx(0.002) and a["noise_sd"]["0.1"] == pytest.approx(0.0038)
    assert set(a["noise_sd"]) == {"0.1", "0.3333", "1"}
    fixed, slope = a["wall_fit"]
    assert fixed == pytest.approx(FIXED) and slope == pytest.approx(1.0)
    assert a["costs"]["0.1"]["relative"] == pytest.approx((FIXED + 3) / (FIXED + 30))
    fid = a["fidelity"]
    # the optimum moves 0.3 log10 units per unit of (1 - b): 0.2 of the family's coded units
    assert fid["lr_shift"] == pytest.approx(0.3 / 1.5, rel=1e-3)  # 1/3 is stored as 0.3333
    # r = (b + o) / (1 + o) with r = (40 + 30 b) / 70: o = 40 / 30 at every b
    assert fid["overhead"] == pytest.approx(FIXED / 30, rel=1e-3)
    # depth 3 is 0.05 (1 - b) worse; 2 doublings of work a step (200 / 50 steps)
    spread = rf.spread(rf.means(rows)[1.0])
    assert fid["size_penalty"] == pytest.approx(0.05 / spread / 2, rel=1e-3)
    # 2**13 is 0.02 (1 - b) worse: 2 doublings = 0.8 of the family's BATCH coded unit
    assert fid["batch_penalty"] == pytest.approx(0.02 / spread / 0.8, rel=1e-3)
    # noise relative to the spread, b ** -x: here the spread grows faster short than the noise does
    rel = {f: 0.002 * (2 - f) / a["spread"][k] for f, k in ((0.1, "0.1"), (0.3333, "0.3333"), (1.0, "1"))}
    want = [-math.log(rel[f] / rel[1.0]) / math.log(f) for f in (0.1, 0.3333)]
    assert fid["noise_exp"] == pytest.approx(sum(want) / 2, rel=1e-3) and fid["noise_exp"] < 0


def test_a_torn_last_line_is_skipped_and_finished_runs_are_not_run_again(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    ok, failed = made_up_rows()[:2]
    failed = {**failed, "val_bpb": None}
    path.write_text(json.dumps(ok) + "\n" + json.dumps(failed) + "\n" + '{"key": "torn')
    assert [r["key"] for r in rf.read_rows(path)] == [ok["key"], failed["key"]]
    todo = [(c, f, s) for c in rf.GRID[:1] for f in FRACTIONS for s in (0, 1, 2)]
    assert rf.remaining(todo, path) == [t for t in todo if rf.key(t[0].name, t[1], t[2]) != ok["key"]]
    # a failed or degraded run runs again once, as the fleet re-runs a degraded run once
    with open(path, "a") as f:
        f.write("\n" + json.dumps({**failed, "val_bpb": 1.0, "degraded": True}) + "\n")
    assert [rf.key(c.name, fr, s) for c, fr, s in rf.remaining(todo, path, retries=1)].count(
        failed["key"]
    ) == 0
    assert [rf.key(c.name, fr, s) for c, fr, s in rf.remaining(todo, path, retries=2)].count(
        failed["key"]
    ) == 1


def test_the_fit_is_a_fidelity_of_the_family() -> None:
    """The fields `fidelity_fit` gives are those `search_family.Fidelity` takes (`--fidelity-from`)."""
    import search_family

    fit = rf.fidelity_fit(made_up_rows())
    assert set(fit) == {"lr_shift", "size_penalty", "batch_penalty", "noise_exp", "overhead"}
    fid = search_family.Fidelity(**fit)
    assert fid.lr_shift == fit["lr_shift"] and fid.overhead == fit["overhead"]
