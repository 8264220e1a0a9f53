"""bench/search_family.py charges a short run what bench/rung_fidelity.py measured it to cost.

The one-`overhead` line (b + o) / (1 + o) through the measured rungs charges a 1/10 run 0.384 of a
full one and a 1/3 run 0.543 where they cost 0.376 and 0.549 (bench/rung_fidelity_2026-12-03.jsonl):
`--fidelity-from` and `cost@F=R` give the family each measured rung's own cost. Also: the summary
table counts greedy x1's wrong keeps apart from a strategy named `greedy`."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import rung_fidelity as rf  # noqa: E402
import search_family as family  # noqa: E402

RESULTS = BENCH / "rung_fidelity_2026-12-03.jsonl"


def test_the_measured_fit_charges_each_measured_rung_its_own_cost() -> None:
    rows = rf.read_rows(RESULTS)
    measured = rf.costs(rows)
    fid = family.build_fidelity("", str(RESULTS))
    assert {k: getattr(fid, k) for k in rf.fidelity_fit(rows)} == rf.fidelity_fit(rows)
    assert fid.cost(0.1) == pytest.approx(measured[0.1]["relative"]) == pytest.approx(0.376, abs=0.001)
    # --screen-fraction 0.333 is the 1/3 rung the grid ran (0.3333)
    assert fid.cost(0.333) == pytest.approx(measured[0.3333]["relative"]) == pytest.approx(0.549, abs=0.001)
    one_line = (0.1 + fid.overhead) / (1 + fid.overhead)
    assert abs(fid.cost(0.1) - one_line) > 0.005  # not the assumed line through both rungs
    # between measured rungs: linear (wall time is linear in training time); below them: the line
    assert fid.cost(0.2) == pytest.approx(
        measured[0.1]["relative"] + (measured[0.3333]["relative"] - measured[0.1]["relative"]) * 0.1 / 0.2333,
        rel=1e-3,
    )
    assert fid.cost(0.05) == pytest.approx((0.05 + fid.overhead) / (1 + fid.overhead))
    assert fid.cost(1.0) == 1.0


def test_a_short_run_takes_the_measured_cost_of_its_rung() -> None:
    m = family.member("d1")
    v = m.values(m.start)
    assert m.crash(v) is None
    fid = family.build_fidelity("overhead=0.46,cost@0.1=0.3762", None)
    _, took = family.short_outcome(m, v, 0.1, fid, np.random.default_rng(0))
    assert took == pytest.approx(m.seconds(v) * 0.3762)
    _, took = family.short_outcome(m, v, 0.1, family.Fidelity(overhead=0.46), np.random.default_rng(0))
    assert took == pytest.approx(m.seconds(v) * 0.56 / 1.46)  # unmeasured: the overhead line


def test_the_text_form_overrides_the_file_and_bad_fields_are_refused() -> None:
    fid = family.build_fidelity("lr_shift=0,cost@0.1=0.5", str(RESULTS))
    assert fid.lr_shift == 0.0 and fid.cost(0.1) == 0.5 and fid.cost(0.333) == pytest.approx(0.549, abs=0.001)
    for bad in ("lr_shfit=1", "cost@1.5=0.3", "cost@0.1=0", "overhead", "overhead=x"):
        with pytest.raises(ValueError, match="--fidelity"):
            family.build_fidelity(bad)


def test_greedy_x1_s_wrong_keeps_are_not_a_greedy_strategy_s(monkeypatch, capsys) -> None:
    """sim seed 4: greedy x1 adopts one worse point in 60 runs; greedy at 16 workers none in 2 waves.
    The summary once counted both in one `wrong["greedy"]`, so each row showed their sum."""
    argv = [
        "search_family.py",
        "--members",
        "sim",
        "--seeds",
        "4",
        "--strategies",
        "greedy",
        "--max-waves",
        "2",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    family.main()
    rows = {
        line.split("  ")[0].strip(): line.split()[-1]
        for line in capsys.readouterr().out.splitlines()
        if line.strip()
    }
    assert rows["greedy x1"] == "1" and rows["greedy"] == "0"
