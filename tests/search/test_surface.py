"""Tests for nightlab.search.strategies.surface: the quadratic response-surface strategy.

Run: .venv/bin/python -m pytest -q tests/search/test_surface.py
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from nightlab.errors import UsageError
from nightlab.search.knobs import parse_value
from nightlab.search.spaces import parse_space
from nightlab.search.strategies import Observation, PatternStrategy, make_strategy
from nightlab.search.strategies.surface import SurfaceStrategy, _box_minimum, _fit, _positive_definite

# X and Y uniform on [-1, 1]: the value is the coded level
DIMS = [parse_space("X=uniform(-1,1)"), parse_space("Y=uniform(-1,1)")]


def valley(knobs: dict[str, str]) -> float:
    """A narrow valley (correlation 0.9 between X and Y), best at X = 0.3, Y = -0.2."""
    x, y = parse_value(knobs["X"]) - 0.3, parse_value(knobs["Y"]) + 0.2
    return 1.0 + 2.0 * x * x + 2.0 * y * y + 3.6 * x * y


def climb(
    strategy, objective, incumbent: dict[str, str], waves: int, k: int = 8, sign: float = 1.0, seen=None
) -> tuple[dict[str, str], list[Observation]]:
    """Exact values, the wave's best adopted when it is better: the strategy's own path, no noise.

    `seen` collects each (incumbent, figure) handed to the strategy.
    """
    history: list[Observation] = []
    figure = [objective(incumbent)] * 2
    for w in range(waves):
        strategy.observe_incumbent(incumbent, figure)
        if seen is not None:
            seen.append((incumbent, figure))
        proposals = strategy.propose(incumbent, history, k)
        if not proposals:
            break
        runs = [Observation(f"e{w}-{i}", p, objective(p), wave=w) for i, p in enumerate(proposals)]
        best = min(runs, key=lambda o: sign * o.value)
        if sign * best.value < sign * figure[0] - 1e-9:
            runs = [Observation(o.id, o.knobs, o.value, w, adopted=o.id == best.id) for o in runs]
            incumbent, figure = dict(best.knobs), [best.value] * 2
        history += runs
    return incumbent, history


def test_the_fit_recovers_curvatures_and_interactions_from_a_stencil_and_pair_corners() -> None:
    H = np.array([[3.0, -0.9, 0.4], [-0.9, 0.5, 0.0], [0.4, 0.0, 1.0]])
    g = np.array([0.5, -0.2, 0.1])
    points = [np.zeros(3)] * 3  # the centre, repeated
    for i in range(3):
        for s in (0.25, -0.25):
            points.append(np.eye(3)[i] * s)
    for i, j in itertools.combinations(range(3), 2):
        points.append((np.eye(3)[i] + np.eye(3)[j]) * 0.25)
    X = np.array(points)
    y = np.array([2.0 + g @ x + 0.5 * x @ H @ x for x in X])
    g_hat, H_hat, _ = _fit(X, y, sigma=1e-6, coupling=1.0, locality=10.0)
    assert np.allclose(g_hat, g, atol=1e-4) and np.allclose(H_hat, H, atol=1e-3)
    # with no pair corners the interactions are not measured: the prior holds them at 0
    _, H_sep, _ = _fit(X[:9], y[:9], sigma=1e-6, coupling=0.3, locality=10.0)
    assert np.allclose(np.diag(H_sep), np.diag(H), atol=1e-3)
    assert np.abs(H_sep - np.diag(np.diag(H_sep))).max() < 1e-3


def test_box_minimum_and_positive_definite() -> None:
    H = np.array([[2.0, 1.8], [1.8, 2.0]])
    inside = _box_minimum(np.array([-1.0, 0.0]), H, -np.full(2, 3.0), np.full(2, 3.0))
    assert np.allclose(inside, np.linalg.solve(H, [1, 0]))
    # the unconstrained minimum (2.63, -2.37) lies outside: the box's own minimum sits on its edge
    d = _box_minimum(np.array([-1.0, 0.0]), H, -np.full(2, 0.5), np.full(2, 0.5))
    assert d[0] == pytest.approx(0.5) and d[1] == pytest.approx(-0.45)
    saddle = _positive_definite(np.array([[1.0, 0.0], [0.0, -1.0]]))
    assert np.linalg.eigvalsh(saddle).min() > 0


def test_first_wave_is_a_stencil_then_the_predicted_point_with_replicas_corners_and_stencil() -> None:
    strategy = SurfaceStrategy(DIMS, first_step=0.3, step=0.2)
    incumbent = {"X": "-0.5", "Y": "0.5"}
    first = strategy.propose(incumbent, [], 16)
    assert [(r["X"], r["Y"]) for r in first] == [
        ("-0.2", "0.5"),
        ("-0.8", "0.5"),
        ("-0.5", "0.8"),
        ("-0.5", "0.2"),
    ]
    history = [Observation(f"e{i}", r, valley(r), wave=0) for i, r in enumerate(first)]
    strategy.observe_incumbent(incumbent, [valley(incumbent)] * 3)
    second = strategy.propose(incumbent, history, 16)
    point = second[0]
    assert second[1] == point and second[2] != point  # two replicas
    assert valley(point) < min(valley(r) for r in first)  # the model's point beats every stencil run
    moved = [r for r in second[2:] if r["X"] != point["X"] and r["Y"] != point["Y"]]
    assert len(moved) == 1  # the one pair corner (X, Y), which measures the interaction
    assert len(second) == 2 + 4 + 1


def test_interactions_take_it_down_a_valley_that_pattern_zig_zags_along() -> None:
    start = {"X": "-0.5", "Y": "0.5"}
    surface, _ = climb(SurfaceStrategy(DIMS), valley, start, waves=4)
    pattern, _ = climb(PatternStrategy(DIMS), valley, start, waves=4)
    assert valley(surface) < 1.002
    assert valley(pattern) > valley(surface) + 0.01


def test_higher_is_better_and_list_and_integer_knobs() -> None:
    dims = [parse_space("X=uniform(-1,1)"), parse_space("D=int(2,12)"), parse_space("P=16,32,64,128")]

    def score(knobs: dict[str, str]) -> float:
        d, p = parse_value(knobs["D"]), parse_value(knobs["P"])
        return 5.0 - (parse_value(knobs["X"]) - 0.4) ** 2 - 0.01 * (d - 9) ** 2 - 0.1 * (np.log2(p) - 6) ** 2

    start = {"X": "-0.6", "D": "3", "P": "16"}
    best, history = climb(SurfaceStrategy(dims, lower_is_better=False), score, start, waves=6, sign=-1.0)
    assert score(best) > score(start) + 0.5
    for o in history:
        assert parse_value(o.knobs["D"]) == int(o.knobs["D"]) and o.knobs["P"] in ("16", "32", "64", "128")


def test_the_radius_follows_the_history_and_the_search_stops_when_it_is_spent() -> None:
    strategy = SurfaceStrategy(DIMS, radius=0.5, grow=2.0, shrink=0.5, max_radius=1.5, min_radius=0.1)
    a, b = {"X": "0.1", "Y": "0.1"}, {"X": "0.2", "Y": "0.1"}
    stencil = [Observation("s", a, 1.0, wave=0)]
    predicted = [Observation("p1", b, 0.9, wave=1, adopted=True), Observation("p2", b, 0.9, wave=1)]
    assert strategy.trust_radius(stencil) == 0.5  # the first wave predicted nothing
    assert strategy.trust_radius(stencil + predicted) == 1.0
    lucky = [
        Observation("q1", b, 0.9, wave=2),
        Observation("q2", b, 0.9, wave=2),
        Observation("c", a, 0.8, 2, True),
    ]
    assert strategy.trust_radius(stencil + predicted + lucky) == 1.0  # another run was adopted: kept
    misses = [Observation(f"m{w}", a, 1.0, wave=w) for w in range(3, 7)]
    assert strategy.trust_radius(stencil + predicted + misses[:3]) == 0.125
    assert strategy.propose(a, stencil + predicted + misses, 8) == []


def test_a_fresh_strategy_given_the_history_and_the_incumbents_proposes_the_same_wave() -> None:
    start = {"X": "-0.5", "Y": "0.5"}
    running, seen = SurfaceStrategy(DIMS), []
    incumbent, history = climb(running, valley, start, waves=3, seen=seen)
    figure = [valley(incumbent)] * 2
    running.observe_incumbent(incumbent, figure)
    fresh = SurfaceStrategy(DIMS)  # a resume: every incumbent the search had, then the history
    for knobs, values in [*seen, (incumbent, figure)]:
        fresh.observe_incumbent(knobs, values)
    assert fresh.propose(incumbent, history, 8) == running.propose(incumbent, history, 8)


def test_near_the_optimum_the_point_gets_more_replicas() -> None:
    strategy = SurfaceStrategy(DIMS, replicas=2, endgame_replicas=4)
    near = {"X": "0.28", "Y": "-0.2"}  # 0.0008 above the optimum
    history = [
        Observation(f"e{i}", r, valley(r), wave=0) for i, r in enumerate(strategy.propose(near, [], 8))
    ]
    strategy.observe_incumbent(near, [0.99, 1.01, 1.0])  # noise sd 0.01: the gain left is far below it
    proposals = strategy.propose(near, history, 8)
    assert proposals[0] != near
    assert proposals[:4] == [proposals[0]] * 4 and proposals[4] != proposals[0]
    # at the optimum itself the model predicts no move: no replicas of the incumbent, a stencil around it
    best = {"X": "0.3", "Y": "-0.2"}
    history = [
        Observation(f"e{i}", r, valley(r), wave=0) for i, r in enumerate(strategy.propose(best, [], 8))
    ]
    strategy.observe_incumbent(best, [1.0, 1.0])
    assert best not in strategy.propose(best, history, 8)


def test_options_are_checked_and_the_name_is_known() -> None:
    with pytest.raises(UsageError, match="at least 1"):
        SurfaceStrategy(DIMS, replicas=0)
    assert isinstance(make_strategy("surface", DIMS), SurfaceStrategy)


def test_a_configuration_that_crashed_is_not_proposed_again() -> None:
    strategy = SurfaceStrategy(DIMS)
    start = {"X": "-0.5", "Y": "0.5"}
    first = strategy.propose(start, [], 8)
    history = [Observation(f"e{i}", r, valley(r), wave=0) for i, r in enumerate(first)]
    strategy.observe_incumbent(start, [valley(start)] * 2)
    predicted = strategy.propose(start, history, 8)[0]
    history.append(Observation("crash", predicted, None, wave=0))  # the model's point crashed
    again = strategy.propose(start, history, 8)
    assert predicted not in again and again
