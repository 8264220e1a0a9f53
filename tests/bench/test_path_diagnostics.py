"""What limits a search's path: bench/two_wave_bound.py and bench/search_family.py's `--noise-scale`.

The bound counts the steps a perfect knob-wise model needs to reach a target: additive knobs are
solved in one step; a rotated valley (two knobs whose best values move with each other) needs a
zig-zag of steps, and the line search along the step does not remove it; knob-wise optima that
crash together give no step. `--noise-scale` scales the noise of the strategies' runs only."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import search_family as family  # noqa: E402
import two_wave_bound as bound  # noqa: E402

from nightlab.search.spaces import parse_space  # noqa: E402


def _member(truth, crash=lambda v: None) -> family.Member:
    dims = [parse_space("X=uniform(-1.0,1.0)"), parse_space("Y=uniform(-1.0,1.0)")]
    return family.Member("t", dims, {"X": "-0.9", "Y": "0.3"}, truth, crash, lambda v: 1.0, lambda v: 0.01)


def test_additive_knobs_take_one_step() -> None:
    m = _member(lambda v: (v["X"] - 0.5) ** 2 + 3 * (v["Y"] + 0.2) ** 2)
    assert bound.steps_to(m, 0.001, line=False) == 1
    assert bound.steps_to(m, 0.001, line=True) == 1


def test_a_rotated_valley_takes_a_zig_zag_of_steps() -> None:
    # the best X moves with Y (and Y with X): each knob-wise step lands on the other's old line
    m = _member(lambda v: (v["X"] - v["Y"]) ** 2 + 0.05 * (v["X"] + v["Y"]) ** 2)
    steps = bound.steps_to(m, 0.01, line=False)
    assert steps is None or steps > 2
    lined = bound.steps_to(m, 0.01, line=True)
    assert lined is None or lined > 1


def test_knob_wise_optima_that_crash_together_give_no_step() -> None:
    m = _member(
        lambda v: (v["X"] - 0.5) ** 2 + (v["Y"] - 0.5) ** 2,
        crash=lambda v: "oom" if v["X"] > 0.3 and v["Y"] > 0.3 else None,
    )
    assert bound.steps_to(m, 0.001, line=False) is None


def test_noise_scale_scales_the_strategies_noise_only() -> None:
    m = family.member("d3")
    v = m.values(m.start)
    assert family._noise_scaled(m, 1.0) is m
    quiet = family._noise_scaled(m, 0.05)
    assert quiet.sd(v) == 0.05 * m.sd(v) > 0
    assert quiet.truth(v) == m.truth(v) and quiet.start == m.start


def test_race_by_race_takes_the_races_both_reached() -> None:
    import race_by_race

    a = {("d0", 0): 2.0, ("d0", 1): 4.0, ("d1", 0): 0.0, ("d1", 1): None}
    b = {("d0", 0): 4.0, ("d0", 1): 2.0, ("d1", 0): 3.0, ("d1", 1): None}
    c = race_by_race.compare(a, b)
    # (d0, 0) x2 and (d0, 1) x0.5: even; (d1, 0) only B reached, (d1, 1) no race
    assert c["ratio"] == 1.0 and c["races"] == 2 and (c["better"], c["worse"]) == (1, 1)
    assert (c["reached_a"], c["reached_b"]) == (2, 3)
