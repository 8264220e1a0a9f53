"""Tests for nightlab.search.effects: least-squares effects against a known synthetic model.

Run: .venv/bin/python -m pytest -q tests/search/test_effects.py
"""

from __future__ import annotations

import itertools
import random

import pytest

from nightlab.search.designs import fractional_factorial
from nightlab.search.effects import estimate_effects, plot_main_effects
from nightlab.search.spaces import parse_space

FACTORS = ("A", "B", "C")
TRUE = {"A": 0.5, "B": -0.2, "C": 0.0, "A:B": 0.0, "A:C": 0.3, "B:C": 0.0}


def model(row: dict[str, float]) -> float:
    value = 1.0
    for term, coef in TRUE.items():
        x = 1.0
        for f in term.split(":"):
            x *= row[f]
        value += coef * x
    return value


def full_rows(repeats: int) -> list[dict[str, float]]:
    return [dict(zip(FACTORS, c, strict=True)) for c in itertools.product([-1.0, 1.0], repeat=3)] * repeats


def test_recovers_known_coefficients_with_interactions() -> None:
    rng = random.Random(0)
    rows = full_rows(3)
    sigma = 0.01
    y = [model(r) + rng.gauss(0, sigma) for r in rows]
    result = estimate_effects(rows, y, FACTORS)
    assert result.message is None
    assert result.residual_dof == 24 - 7
    assert result.intercept == pytest.approx(1.0, abs=4 * sigma)
    for term, coef in TRUE.items():
        eff = next(t for t in result.terms if t.term == term)
        # Standard error of a coefficient on an orthogonal +-1 design is sigma / sqrt(n).
        assert eff.std_error == pytest.approx(sigma / 24**0.5, rel=0.5)
        assert abs(eff.coefficient - coef) < 4 * eff.std_error
        assert (eff.p_value < 1e-6) == (coef != 0.0)
    assert [t.term for t in result.main_effects] == ["A", "B", "C"]
    assert result.coefficient("A") * 2 == pytest.approx(next(t.effect for t in result.terms if t.term == "A"))
    # Lower is better: A low, B high; with A low, A:C = +0.3 * (-1) * C favours C high.
    assert result.predicted_best == {"A": -1.0, "B": 1.0, "C": 1.0}
    assert result.predicted_metric == pytest.approx(model({"A": -1, "B": 1, "C": 1}), abs=0.02)
    best_high = estimate_effects(rows, y, FACTORS, lower_is_better=False).predicted_best
    assert best_high == {"A": 1.0, "B": -1.0, "C": 1.0}


def test_main_effects_only() -> None:
    rows = full_rows(1)
    result = estimate_effects(rows, [model(r) for r in rows], FACTORS, interactions=False)
    assert [t.term for t in result.terms] == ["A", "B", "C"]
    assert result.coefficient("A") == pytest.approx(0.5)


def test_aliased_terms_of_a_fraction_are_dropped() -> None:
    design = fractional_factorial(
        [parse_space(f"{f}=uniform(0,1)") for f in ("A", "B", "C", "D")], resolution=4
    )
    rows = [dict(c) for c in design.coded] * 2
    y = [1 + 0.4 * r["A"] - 0.1 * r["D"] for r in rows]
    result = estimate_effects(rows, y, ("A", "B", "C", "D"))
    # 2^(4-1) IV: the six two-way interactions fall into three aliased pairs, one of each is kept.
    assert len(result.interactions) == 3 and len(result.dropped) == 3
    assert result.coefficient("A") == pytest.approx(0.4)
    assert result.coefficient("D") == pytest.approx(-0.1)
    assert "not estimable" in result.message


def test_saturated_design_has_no_standard_errors() -> None:
    rows = [{"A": -1.0}, {"A": 1.0}]
    result = estimate_effects(rows, [2.0, 1.0], ("A",))
    assert result.coefficient("A") == pytest.approx(-0.5)
    assert result.terms[0].std_error is None
    assert "no residual degrees of freedom" in result.message


def test_interactions_traded_for_standard_errors_when_no_residual_is_left() -> None:
    rows = full_rows(1)  # 8 runs, 7 terms with interactions: 1 residual dof, kept
    assert (
        estimate_effects(rows, [model(r) + 0.001 * i for i, r in enumerate(rows)], FACTORS).residual_dof == 1
    )
    two = [{"A": a, "B": b} for a, b in itertools.product([-1.0, 1.0], repeat=2)]
    result = estimate_effects(two, [1.0, 2.0, 3.0, 5.0], ("A", "B"))  # 4 runs, 4 terms: drop A:B
    assert [t.term for t in result.terms] == ["A", "B"]
    assert result.residual_dof == 1 and result.terms[0].std_error is not None


def test_all_crashed_says_so_without_numbers() -> None:
    result = estimate_effects([], [], FACTORS, crashed=8)
    assert result.message == "all 8 runs crashed; no effects to estimate"
    assert result.terms == () and result.intercept is None and result.predicted_metric is None
    with pytest.raises(ValueError, match="all 8 runs crashed"):
        plot_main_effects(result, "unused.png")


def test_partial_wave_reports_pending() -> None:
    rows = full_rows(1)
    result = estimate_effects(rows[:6], [model(r) for r in rows[:6]], FACTORS, pending=2, crashed=1)
    assert result.pending == 2
    assert result.message.startswith("2 still running (partial result); 1 crashed")
    nothing = estimate_effects([], [], FACTORS, pending=5)
    assert nothing.message == "no run has finished yet; 5 still running"


def test_plot_main_effects(tmp_path) -> None:
    rows = full_rows(2)
    rng = random.Random(1)
    result = estimate_effects(rows, [model(r) + rng.gauss(0, 0.01) for r in rows], FACTORS)
    out = plot_main_effects(result, tmp_path / "effects.png", metric="val_bpb")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
