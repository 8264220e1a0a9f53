"""Tests for nightlab.search.designs: full, fractional (resolution, balance, orthogonality) and random.

Aliasing is checked directly on the coded design matrix, independently of how the generator
was found: two terms are aliased when their columns are equal up to sign.

Run: .venv/bin/python -m pytest -q tests/search/test_designs.py
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from nightlab.errors import UsageError
from nightlab.search.designs import (
    Design,
    fractional_factorial,
    full_factorial,
    make_design,
    random_design,
    two_level_design,
)
from nightlab.search.spaces import parse_space


def dims_of(k: int) -> list:
    return [parse_space(f"K{i}=uniform(0,1)") for i in range(k)]


def matrix(design) -> np.ndarray:
    return np.array([[c[f] for f in design.factors] for c in design.coded])


def aliased(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.array_equal(a, b) or np.array_equal(a, -b))


def test_full_factorial_all_combinations() -> None:
    dims = [parse_space("A=int(1,3)"), parse_space("B=x,y,z"), parse_space("C=pow2(2,8)")]
    design = full_factorial(dims, levels=3)
    assert len(design) == 3 * 3 * 3
    assert {tuple(r.values()) for r in design.runs} == set(
        itertools.product(["1", "2", "3"], ["'x'", "'y'", "'z'"], ["2**1", "2**2", "2**3"])
    )
    two = full_factorial(dims[:1] + dims[2:])
    assert sorted(tuple(c.values()) for c in two.coded) == sorted(itertools.product([-1.0, 1.0], repeat=2))
    assert two.runs[0] == {"A": "1", "C": "2**1"}


def test_full_factorial_refuses_empty_one_level_and_huge() -> None:
    with pytest.raises(UsageError, match="empty design"):
        full_factorial([])
    with pytest.raises(UsageError, match="at least 2 levels"):
        full_factorial(dims_of(2), levels=1)
    with pytest.raises(UsageError, match="`2048` runs"):
        full_factorial(dims_of(11))


@pytest.mark.parametrize(
    ("k", "resolution", "runs"), [(3, 3, 4), (4, 4, 8), (5, 5, 16), (7, 3, 8), (8, 4, 16), (6, 5, 32)]
)
def test_fractional_resolution_balance_orthogonality(k: int, resolution: int, runs: int) -> None:
    design = fractional_factorial(dims_of(k), resolution=resolution)
    X = matrix(design)
    assert X.shape == (runs, k)  # the fewest runs that reach the resolution
    assert design.resolution is not None and design.resolution >= resolution
    assert set(np.unique(X)) == {-1.0, 1.0}
    assert np.all(X.sum(axis=0) == 0)  # balanced: half the runs at each level
    assert np.array_equal(X.T @ X, runs * np.eye(k))  # orthogonal main-effect columns
    mains = [X[:, i] for i in range(k)]
    pairs = {(i, j): X[:, i] * X[:, j] for i, j in itertools.combinations(range(k), 2)}
    for a, b in itertools.combinations(range(k), 2):
        assert not aliased(mains[a], mains[b])
    if resolution >= 4:
        for i in range(k):
            assert not any(aliased(mains[i], col) for col in pairs.values())
    if resolution >= 5:
        for (p, col_p), (q, col_q) in itertools.combinations(pairs.items(), 2):
            assert not aliased(col_p, col_q), (p, q)
    # The reported alias list agrees with the matrix: resolution III shows main = interaction.
    assert bool(design.aliases) == (design.resolution < 5)


def test_resolution_three_aliases_a_main_effect_with_an_interaction() -> None:
    design = fractional_factorial(dims_of(3), resolution=3)
    X = matrix(design)
    assert aliased(X[:, 2], X[:, 0] * X[:, 1])
    assert "K2 = K0:K1" in design.aliases or "K0 = K1:K2" in design.aliases


def test_fractional_chooses_a_resolution() -> None:
    assert fractional_factorial(dims_of(3)).resolution == 3  # IV is impossible with a fraction of 8
    design = fractional_factorial(dims_of(5))
    assert (len(design), design.resolution) == (16, 5)  # IV needs 16 runs, where V also fits
    assert len(fractional_factorial(dims_of(7))) == 16


def test_fractional_maps_levels_to_knob_text() -> None:
    dims = [parse_space("BS=pow2(16,128)"), parse_space("P=SSSL,L"), parse_space("LR=log(0.01,0.04)")]
    design = fractional_factorial(dims)
    for run, coded in zip(design.runs, design.coded, strict=True):
        assert run["BS"] == ("2**4" if coded["BS"] < 0 else "2**7")
        assert run["P"] == ("'SSSL'" if coded["P"] < 0 else "'L'")
        assert run["LR"] == ("0.01" if coded["LR"] < 0 else "0.04")


def test_fractional_bad_input() -> None:
    with pytest.raises(UsageError, match="at least 3"):
        fractional_factorial(dims_of(2))
    with pytest.raises(UsageError, match="empty design"):
        fractional_factorial([])
    with pytest.raises(UsageError, match="resolution `IV`"):
        fractional_factorial(dims_of(3), resolution=4)
    with pytest.raises(UsageError, match="aliases main effects"):
        fractional_factorial(dims_of(4), resolution=2)
    with pytest.raises(UsageError, match="exactly 2"):
        fractional_factorial([*dims_of(2), parse_space("P=a,b,c")])


def test_two_level_design_fits_the_wave() -> None:
    assert two_level_design(dims_of(3), max_runs=8).kind == "full"
    design = two_level_design(dims_of(6), max_runs=16)
    assert (design.kind, len(design), design.resolution) == ("fractional", 16, 4)
    with pytest.raises(UsageError, match="raise --wave-size to 8"):
        two_level_design(dims_of(6), max_runs=6)


def test_random_design_distinct_and_seeded() -> None:
    dims = [parse_space("LR=log(0.001,0.1)"), parse_space("D=int(2,9)")]
    a, b = random_design(dims, 10, seed=3), random_design(dims, 10, seed=3)
    assert a.runs == b.runs and len(a) == 10
    assert len({tuple(r.values()) for r in a.runs}) == 10
    assert all(-1.0 <= c["LR"] <= 1.0 for c in a.coded)
    small = random_design([parse_space("P=a,b")], 5)  # only 2 combinations exist: repeats allowed
    assert len(small) == 5 and {r["P"] for r in small.runs} == {"'a'", "'b'"}
    with pytest.raises(UsageError, match="at least 1 run"):
        random_design(dims, 0)


def test_design_round_trips_through_json() -> None:
    import json

    design = fractional_factorial(dims_of(4))
    assert Design.from_dict(json.loads(json.dumps(design.to_dict()))) == design


def test_make_design_dispatches_on_the_flag() -> None:
    dims = dims_of(3)
    assert make_design("full", dims) == full_factorial(dims)
    assert make_design("fractional", dims, resolution=3) == fractional_factorial(dims, resolution=3)
    assert make_design("random", dims, size=5, seed=2) == random_design(dims, 5, seed=2)
    with pytest.raises(UsageError, match="needs a size"):
        make_design("random", dims)
    with pytest.raises(UsageError, match="unknown design `latin`"):
        make_design("latin", dims)
