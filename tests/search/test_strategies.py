"""Tests for nightlab.search.strategies: factorial, greedy, pattern and Optuna strategies and the research loop.

The loop runs against an in-memory fake lab: a known objective plus Gaussian noise, the
incumbent re-measured four times after each adoption, and `best_of_wave` as the judge.

Run: .venv/bin/python -m pytest -q tests/search/test_strategies.py
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from nightlab.errors import UsageError
from nightlab.search.decide import best_of_wave
from nightlab.search.knobs import parse_value
from nightlab.search.spaces import parse_space
from nightlab.search.strategies import (
    FactorialStrategy,
    GreedyStrategy,
    Observation,
    OptunaStrategy,
    PatternStrategy,
    make_strategy,
    run_loop,
)
from nightlab.search.strategies._base import stencil

# --- factorial ------------------------------------------------------------------------------


def test_factorial_centres_a_two_level_design_on_the_incumbent() -> None:
    dims = [parse_space("X=uniform(0,1)"), parse_space("Y=uniform(0,1)"), parse_space("P=a,b,c")]
    strategy = FactorialStrategy(dims, step=0.25)
    incumbent = {"X": "0.5", "Y": "0.1", "P": "'b'"}
    design = strategy.design(incumbent, [], 8)
    assert design.kind == "full" and len(design) == 8
    assert {r["X"] for r in design.runs} == {"0.375", "0.625"}  # 0.5 +- 0.25 coded = +-0.125
    assert {r["Y"] for r in design.runs} == {"0.0", "0.25"}  # clipped at the edge, width kept
    assert {r["P"] for r in design.runs} == {"'b'", "'a'"}
    # A wave without adoption halves the step and pairs the list knob with its next value.
    history = [Observation(f"e{i}", r, 1.0, wave=0) for i, r in enumerate(design.runs)]
    second = strategy.design(incumbent, history, 8)
    assert {r["X"] for r in second.runs} == {"0.4375", "0.5625"}
    assert {r["P"] for r in second.runs} == {"'b'", "'c'"}


def test_factorial_uses_a_fraction_when_the_wave_is_small_and_stops_when_converged() -> None:
    dims = [parse_space(f"K{i}=uniform(0,1)") for i in range(5)]
    strategy = FactorialStrategy(dims, step=0.5, min_step=0.2)
    incumbent = {f"K{i}": "0.5" for i in range(5)}
    design = strategy.design(incumbent, [], 16)
    assert (design.kind, len(design), design.resolution) == ("fractional", 16, 5)
    with pytest.raises(UsageError, match="raise --wave-size to 8"):
        strategy.propose(incumbent, [], 4)
    history = [Observation(f"e{w}", {}, 1.0, wave=w) for w in range(2)]  # two misses: step 0.125 < 0.2
    assert strategy.propose(incumbent, history, 16) == []


def test_factorial_integer_knob_always_moves() -> None:
    strategy = FactorialStrategy([parse_space("D=int(4,6)")], step=0.05, min_step=0.01)
    runs = strategy.propose({"D": "5"}, [], 2)
    assert len({r["D"] for r in runs}) == 2


def test_factorial_with_unhashable_list_values() -> None:
    strategy = FactorialStrategy([parse_space("B=[0.8,0.95],[0.9,0.99]"), parse_space("X=uniform(0,1)")])
    runs = strategy.propose({"B": "[0.8, 0.95]", "X": "0.5"}, [], 4)
    assert sorted({r["B"] for r in runs}) == ["[0.8,0.95]", "[0.9,0.99]"]


def test_missing_incumbent_knob() -> None:
    with pytest.raises(UsageError, match="no knob `X`"):
        FactorialStrategy([parse_space("X=uniform(0,1)")]).propose({}, [], 4)


# --- greedy ---------------------------------------------------------------------------------


def test_greedy_moves_one_knob_at_a_time_then_halves_the_step() -> None:
    dims = [parse_space("X=uniform(0,1)"), parse_space("D=int(0,8)")]
    strategy = GreedyStrategy(dims, step=0.5, min_step=0.25)
    incumbent = {"X": "0.5", "D": "4"}
    first = strategy.propose(incumbent, [], 2)
    assert first == [{"X": "0.75"}, {"X": "0.25"}]
    history = [Observation(f"e{i}", {**incumbent, **m}, 1.0, wave=0) for i, m in enumerate(first)]
    second = strategy.propose(incumbent, history, 2)
    assert second == [{"D": "6"}, {"D": "2"}]
    history += [Observation(f"e{i + 2}", {**incumbent, **m}, 1.0, wave=1) for i, m in enumerate(second)]
    assert strategy.propose(incumbent, history, 4) == [{"X": "0.625"}, {"X": "0.375"}, {"D": "5"}, {"D": "3"}]
    history += [
        Observation("x1", {"X": "0.625", "D": "4"}, 1.0, wave=3),
        Observation("x2", {"X": "0.375", "D": "4"}, 1.0, wave=3),
        Observation("x3", {"X": "0.5", "D": "5"}, 1.0, wave=3),
        Observation("x4", {"X": "0.5", "D": "3"}, 1.0, wave=3),
    ]
    assert strategy.propose(incumbent, history, 2) == []  # every move down to min_step tried


def test_greedy_list_knob_steps_to_neighbours() -> None:
    strategy = GreedyStrategy([parse_space("P=a,b,c")])
    assert strategy.propose({"P": "'a'"}, [], 4) == [{"P": "'b'"}]


# --- optuna ---------------------------------------------------------------------------------

QUAD_DIMS = [parse_space("X=uniform(-2,2)"), parse_space("Y=uniform(-2,2)")]


# --- pattern ----------------------------------------------------------------------------------

PATTERN_DIMS = [parse_space("X=uniform(0,1)"), parse_space("Y=uniform(0,1)"), parse_space("Z=uniform(0,1)")]


def bowl3(knobs: dict[str, str]) -> float:
    """Exactly quadratic in coded units (X, Y, Z uniform on [0, 1]): best at X = 0.7, Y = 0.3; Z is flat."""
    x, y = parse_value(knobs["X"]), parse_value(knobs["Y"])
    return 1.0 + 2.0 * (x - 0.7) ** 2 + 0.5 * (y - 0.3) ** 2


def test_pattern_stencil_then_the_fitted_minimum_with_repeats() -> None:
    strategy = PatternStrategy(PATTERN_DIMS, step=0.25, carry=False)  # carried repeats: the next test
    incumbent = {"X": "0.5", "Y": "1.0", "Z": "0.5"}
    first = strategy.propose(incumbent, [], 16)
    # +-0.25 coded = +-0.125; Y sits at the top edge, so its stencil is one-sided
    assert [(r["X"], r["Y"], r["Z"]) for r in first] == [
        ("0.625", "1.0", "0.5"),
        ("0.375", "1.0", "0.5"),
        ("0.5", "0.875", "0.5"),
        ("0.5", "0.75", "0.5"),
        ("0.5", "1.0", "0.625"),
        ("0.5", "1.0", "0.375"),
    ]
    history = [Observation(f"e{i}", r, bowl3(r), wave=0) for i, r in enumerate(first)]
    assert strategy.propose(incumbent, history, 16) == first  # no figure of the centre: the stencil again
    strategy.observe_incumbent(incumbent, [bowl3(incumbent)])
    second = strategy.propose(incumbent, history, 16)
    # a parabola through three exact points finds each minimum; the flat Z stays
    assert second[0] == second[1] == {"X": "0.7", "Y": "0.3", "Z": "0.5"}
    assert {(r["X"], r["Y"]) for r in second[2:]} >= {("0.825", "0.3"), ("0.575", "0.3"), ("0.7", "0.425")}
    assert len(second) == 2 + 6
    # a smaller wave: the new point twice, then the knob with the most to gain (Y: 0.245 against 0.08)
    small = strategy.propose(incumbent, history, 4)
    assert [(r["X"], r["Y"]) for r in small] == [
        ("0.7", "0.3"),
        ("0.7", "0.3"),
        ("0.7", "0.425"),
        ("0.7", "0.175"),
    ]


def test_pattern_after_a_crash_goes_only_to_the_better_run_and_ignores_noise() -> None:
    strategy = PatternStrategy(PATTERN_DIMS[:2], step=0.25)
    incumbent = {"X": "0.5", "Y": "0.5"}
    runs = strategy.propose(incumbent, [], 8)
    values = {"0.625": None, "0.375": 0.98}  # up in X crashed; down in X is better

    def value(r: dict[str, str]) -> float | None:
        if r["X"] != "0.5":
            return values[r["X"]]
        return 1.0 + (0.0001 if r["Y"] == "0.625" else -0.0001)  # Y: inside the noise

    history = [Observation(f"e{i}", r, value(r), wave=0) for i, r in enumerate(runs)]
    history += [Observation("r1", incumbent, 1.002, wave=0), Observation("r2", incumbent, 0.998, wave=0)]
    strategy.observe_incumbent(incumbent, [1.002, 0.998])
    proposals = strategy.propose(incumbent, history, 8)
    # the measured point has 1 run: one more would reuse its seed, so it gets 2
    assert proposals[:2] == [{"X": "0.375", "Y": "0.5"}] * 2
    assert [(r["X"], r["Y"]) for r in proposals[2:]] == [  # and the stencil around it
        ("0.5", "0.5"),
        ("0.25", "0.5"),
        ("0.375", "0.625"),
        ("0.375", "0.375"),
    ]


def test_pattern_with_one_slot_measures_a_new_point_each_wave() -> None:
    # a wave of one run: its centre is the incumbent the run moved one knob from (before, the run
    # was taken for the centre, no stencil was found, and the next wave proposed the same point)
    incumbent = {"X": "0.5", "Y": "1.0", "Z": "0.5"}
    strategy = PatternStrategy(PATTERN_DIMS, step=0.25)
    strategy.observe_incumbent(incumbent, [bowl3(incumbent)] * 3)
    history: list[Observation] = []
    seen: list[dict[str, str]] = []
    for wave in range(4):
        [point] = strategy.propose(incumbent, history, 1)
        assert point not in seen, (wave, point)
        seen.append(point)
        history.append(Observation(f"e{wave}", point, bowl3(point), wave=wave))


def test_pattern_carries_a_one_run_winner_into_its_next_wave() -> None:
    # a stencil point that wins on one run is within the noise (a keep needs two runs a side):
    # its two more runs go with the next wave instead of a settle round of their own
    incumbent = {"X": "0.5", "Y": "1.0", "Z": "0.5"}
    strategy = PatternStrategy(PATTERN_DIMS, step=0.25)
    assert strategy.settles_in_next_wave(16) and not strategy.settles_in_next_wave(3)
    first = strategy.propose(incumbent, [], 16)
    history = [Observation(f"e{i}", r, bowl3(r), wave=0) for i, r in enumerate(first)]
    strategy.observe_incumbent(incumbent, [bowl3(incumbent)] * 3)
    second = strategy.propose(incumbent, history, 16)
    best = min(first, key=bowl3)  # Y one step down: 0.75
    assert second[0] == second[1] == {"X": "0.7", "Y": "0.3", "Z": "0.5"}
    assert second[2] == second[3] == best and best not in second[4:]
    # the wave after it still follows the fitted stencil: the carried runs are left out of it
    wave1 = [Observation(f"f{i}", r, bowl3(r), wave=1) for i, r in enumerate(second)]
    third = strategy.propose(incumbent, history + wave1, 16)
    # (the exact minimum: nothing to follow, so it is the next centre, with two more runs)
    assert third[0] == third[1] == {"X": "0.7", "Y": "0.3", "Z": "0.5"}
    assert {"X": "0.7", "Y": "0.3", "Z": "0.5"} not in third[2:]
    assert all(sum(r[n] != third[0][n] for n in "XYZ") == 1 for r in third[2:])
    # after a wave that adopted, only a point that beats the new incumbent's figure is carried
    adopted = [Observation(o.id, o.knobs, o.value, wave=0, adopted=o.knobs == best) for o in history]
    strategy.observe_incumbent(best, [bowl3(best)] * 2)
    assert best not in strategy.propose(best, adopted, 16)
    point = second[0]
    lucky = second[4]  # a stencil point of the fitted one, better than it on its one run
    kept = [
        Observation(o.id, o.knobs, 0.99 if o.knobs == lucky else bowl3(o.knobs), wave=1, adopted=o.id == "f0")
        for o in wave1
    ]
    strategy.observe_incumbent(point, [bowl3(point)] * 2)
    after = strategy.propose(point, history + kept, 16)
    assert after.count(lucky) == 2
    # nor with carry=False (the loop settles then)
    plain = PatternStrategy(PATTERN_DIMS, step=0.25, carry=False)
    plain.observe_incumbent(incumbent, [bowl3(incumbent)] * 3)
    assert not plain.settles_in_next_wave(16) and best not in plain.propose(incumbent, history, 16)


def test_pattern_explores_from_the_unsettled_best_when_its_centre_crashed() -> None:
    # the fitted point crashed, so the wave has no centre figure; the incumbent's own stencil was
    # measured already: the next wave is the wave's one-run best twice and a stencil around it
    strategy = PatternStrategy(PATTERN_DIMS, step=0.25)
    incumbent = {"X": "0.5", "Y": "1.0", "Z": "0.5"}
    first = strategy.propose(incumbent, [], 16)
    history = [Observation(f"e{i}", r, bowl3(r), wave=0) for i, r in enumerate(first)]
    strategy.observe_incumbent(incumbent, [bowl3(incumbent)] * 3)
    second = strategy.propose(incumbent, history, 16)
    crashed = [
        Observation(f"f{i}", r, None if r == second[0] else bowl3(r), wave=1) for i, r in enumerate(second)
    ]
    third = strategy.propose(incumbent, history + crashed, 16)
    best = min((o for o in crashed if o.value is not None), key=lambda o: o.value).knobs
    assert third[:2] == [best, best] and best != incumbent
    assert all(sum(r[n] != best[n] for n in "XYZ") == 1 for r in third[2:])  # its stencil
    plain = PatternStrategy(PATTERN_DIMS, step=0.25, explore=False)
    plain.observe_incumbent(incumbent, [bowl3(incumbent)] * 3)
    again = plain.propose(incumbent, history + crashed, 16)  # the incumbent's stencil again
    assert all(sum(r[n] != incumbent[n] for n in "XYZ") == 1 for r in again)


def test_pattern_stencil_tries_every_list_level_and_the_edge_it_is_near() -> None:
    dims = [parse_space("ACT=relu,gelu,relu2,swiglu"), parse_space("B2=uniform(0.0,1.0)")]
    centre = {"ACT": "'relu'", "B2": "0.95"}  # coded 0.9: 0.1 from the top edge, a step is 0.25
    # the plain stencil: two of the three other levels (swiglu never), and B2 only downwards
    assert [(r["ACT"], r["B2"]) for r in stencil(dims, centre, 0.25, ["ACT", "B2"])] == [
        ("'gelu'", "0.95"),
        ("'relu2'", "0.95"),
        ("'relu'", "0.825"),
        ("'relu'", "0.7"),
    ]
    wide = stencil(dims, centre, 0.25, ["ACT", "B2"], all_levels=True, to_edge=True)
    assert [(r["ACT"], r["B2"]) for r in wide] == [
        ("'gelu'", "0.95"),
        ("'relu2'", "0.95"),
        ("'swiglu'", "0.95"),
        ("'relu'", "1.0"),  # the edge itself, then a step down
        ("'relu'", "0.825"),
    ]
    # at the edge (or within a quarter step of it) the stencil stays one-sided
    at_edge = stencil(dims, {"ACT": "'relu'", "B2": "1.0"}, 0.25, ["B2"], to_edge=True)
    assert [r["B2"] for r in at_edge] == ["0.875", "0.75"]
    # pattern uses both
    first = PatternStrategy(dims, step=0.25).propose(centre, [], 16)
    assert first == wide


def test_pattern_opening_measures_every_knob_once_when_the_stencil_does_not_fit() -> None:
    # three knobs, a wave of 4: the stencil (6 runs) would leave Z unmeasured until the next wave;
    # with `cover` each knob gets one run first (towards the middle of its range; Y at its top
    # edge goes down), then the other side of the first knob in the slot left
    incumbent = {"X": "0.3", "Y": "1.0", "Z": "0.5"}
    strategy = PatternStrategy(PATTERN_DIMS, step=0.25)
    first = strategy.propose(incumbent, [], 4)
    assert [(r["X"], r["Y"], r["Z"]) for r in first] == [
        ("0.425", "1.0", "0.5"),
        ("0.3", "0.875", "0.5"),
        ("0.3", "1.0", "0.625"),
        ("0.175", "1.0", "0.5"),
    ]
    assert (
        PatternStrategy(PATTERN_DIMS, step=0.25, cover=False).propose(incumbent, [], 4)
        == stencil(PATTERN_DIMS, incumbent, 0.25, ["X", "Y", "Z"], all_levels=True, to_edge=True)[:4]
    )
    # a one-run knob whose run is better moves there; the knobs measured on one side come first
    history = [Observation(f"e{i}", r, bowl3(r), wave=0) for i, r in enumerate(first)]
    strategy.observe_incumbent(incumbent, [bowl3(incumbent)] * 3)
    second = strategy.propose(incumbent, history, 8)  # the point twice, the carried best twice, 4 more
    assert second[0] == second[1] and second[0]["Y"] == "0.875"  # Y's one run was better: it went there
    assert second[0]["X"] == "0.7"  # X was measured on both sides: its parabola's minimum
    assert second[2] == second[3] == first[0]  # X's one-run best, carried
    moved = {n for r in second[4:] for n in "XYZ" if r[n] != second[0][n]}
    assert moved == {"Y", "Z"}  # measured on one side only: first in the next stencil


def test_pattern_stops_after_misses_and_checks_options() -> None:
    strategy = PatternStrategy(PATTERN_DIMS, step=0.25, min_step=0.1, patience=1)
    history = [Observation(f"e{w}", {"X": "0.5"}, 1.0, wave=w) for w in range(2)]
    assert strategy.propose({"X": "0.5", "Y": "0.5", "Z": "0.5"}, history, 16) == []
    with pytest.raises(UsageError, match="must be at least 1"):
        PatternStrategy(PATTERN_DIMS, replicas=0)
    assert isinstance(make_strategy("pattern", PATTERN_DIMS), PatternStrategy)


def quadratic(knobs: dict[str, str]) -> float:
    return (float(knobs["X"]) - 0.7) ** 2 + (float(knobs["Y"]) + 0.3) ** 2


def run_optuna(strategy: OptunaStrategy, waves: int, k: int) -> list[list[Observation]]:
    history: list[Observation] = []
    out = []
    for w in range(waves):
        proposals = strategy.propose({}, history, k)
        assert len(proposals) == k
        assert len({tuple(sorted(p.items())) for p in proposals}) == k
        wave = [Observation(f"e{w}-{i}", p, quadratic(p), wave=w) for i, p in enumerate(proposals)]
        strategy.tell(wave)
        history += wave
        out.append(wave)
    return out


def test_optuna_tpe_proposes_distinct_batches_and_improves() -> None:
    waves = run_optuna(OptunaStrategy(QUAD_DIMS, seed=0, n_startup_trials=8), waves=8, k=4)
    random_phase = [o.value for w in waves[:2] for o in w]
    model_phase = [o.value for w in waves[-3:] for o in w]
    assert min(model_phase) < min(random_phase)
    assert sum(model_phase) / len(model_phase) < sum(random_phase) / len(random_phase)
    assert min(o.value for w in waves for o in w) < 0.05


def test_optuna_gp_sampler() -> None:
    waves = run_optuna(OptunaStrategy(QUAD_DIMS, seed=0, sampler="gp", n_startup_trials=4), waves=3, k=4)
    assert min(o.value for o in waves[-1]) < min(o.value for o in waves[0])


def test_optuna_resumes_by_replaying_history() -> None:
    first = OptunaStrategy(QUAD_DIMS, seed=1)
    history = [o for w in run_optuna(first, waves=3, k=4) for o in w]
    history.append(Observation("crash", {"X": "0.1", "Y": "0.1"}, None, wave=3))
    history.append(Observation("outside", {"X": "5.0", "Y": "0.0"}, 1.0, wave=3))  # e.g. the start point
    fresh = OptunaStrategy(QUAD_DIMS, seed=1)
    proposals = fresh.propose({}, history, 4)
    assert len(proposals) == 4
    states = [t.state.name for t in fresh.study.trials]
    assert states.count("COMPLETE") == 12 and states.count("FAIL") == 1 and states.count("RUNNING") == 4
    # Telling the pending proposals completes those trials instead of adding new ones.
    fresh.tell([Observation(f"n{i}", p, quadratic(p), wave=4) for i, p in enumerate(proposals)])
    assert [t.state.name for t in fresh.study.trials].count("COMPLETE") == 16


def test_optuna_small_space_returns_what_is_left_and_pow2_text() -> None:
    strategy = OptunaStrategy([parse_space("P=a,b"), parse_space("BS=pow2(16,32)")], seed=0)
    proposals = strategy.propose({}, [], 10)
    assert sorted(tuple(sorted(p.items())) for p in proposals) == sorted(
        (("BS", bs), ("P", p)) for bs in ("2**4", "2**5") for p in ("'a'", "'b'")
    )


def test_make_strategy() -> None:
    assert isinstance(make_strategy("greedy", QUAD_DIMS), GreedyStrategy)
    assert make_strategy("optuna", QUAD_DIMS, sampler="gp").sampler == "gp"
    with pytest.raises(UsageError, match="unknown strategy `bayes`"):
        make_strategy("bayes", QUAD_DIMS)
    with pytest.raises(UsageError, match="unknown sampler"):
        OptunaStrategy(QUAD_DIMS, sampler="cmaes")
    with pytest.raises(UsageError, match="at least one space"):
        GreedyStrategy([])


# --- the loop -------------------------------------------------------------------------------


class FakeLab:
    """A lab in memory: the objective plus noise, the incumbent measured 4 times per adoption."""

    def __init__(self, objective: Callable[[dict[str, str]], float], incumbent: dict[str, str], sigma: float):
        self.objective, self.sigma = objective, sigma
        self.rng = random.Random(7)
        self.incumbent = dict(incumbent)
        self.incumbent_values = self.measure_incumbent()
        self.waves: dict[str, list[tuple[str, dict[str, str]]]] = {}
        self.adopted: list[Observation] = []
        self.runs = 0

    def measure(self, knobs: dict[str, str]) -> float:
        return self.objective(knobs) + self.rng.gauss(0.0, self.sigma)

    def measure_incumbent(self) -> list[float]:
        return [self.measure(self.incumbent) for _ in range(4)]

    def submit(self, proposals: list[dict[str, str]], index: int) -> str:
        wave_id = f"w{index + 1:03d}"
        runs = []
        for p in proposals:
            self.runs += 1
            runs.append((f"e{self.runs:04d}", {**self.incumbent, **p}))
        self.waves[wave_id] = runs
        return wave_id

    def wait(self, wave_id: str) -> list[Observation]:
        return [Observation(i, k, self.measure(k)) for i, k in self.waves[wave_id]]

    def decide(self, wave_id: str, observations: list[Observation]) -> tuple[Observation | None, str | None]:
        values = {o.id: [o.value] for o in observations if o.value is not None}
        picked = best_of_wave(values, self.incumbent_values, noise_sigma=self.sigma)
        settle = picked[1].repeats_to_settle if picked is not None else None
        if settle is not None and settle.candidate + settle.incumbent <= 4:
            # the loop's settle round: a keep needs the winner's own repeats
            knobs = next(o.knobs for o in observations if o.id == picked[0])
            values[picked[0]] += [self.measure(knobs) for _ in range(settle.candidate)]
            self.incumbent_values += [self.measure(self.incumbent) for _ in range(settle.incumbent)]
            picked = best_of_wave(values, self.incumbent_values, noise_sigma=self.sigma)
        if picked is None:
            return None, None
        winner_id, decision = picked
        winner = next(o for o in observations if o.id == winner_id)
        return (winner if decision.verdict == "keep" else None), decision.verdict

    def adopt(self, observation: Observation) -> None:
        self.adopted.append(observation)
        self.incumbent.update(observation.knobs)
        self.incumbent_values = self.measure_incumbent()

    def loop(self, strategy, **kwargs):
        return run_loop(
            strategy,
            incumbent=self.incumbent,
            submit_wave=self.submit,
            wait_wave=self.wait,
            decide=self.decide,
            adopt=self.adopt,
            incumbent_values=lambda: self.incumbent_values,
            **kwargs,
        )


LOOP_DIMS = [parse_space("LR=log(0.001,0.1)"), parse_space("DEPTH=int(2,12)")]


def bowl(knobs: dict[str, str]) -> float:
    """Best at LR = 0.01, DEPTH = 8; the start (0.001, 2) is 0.122 worse, 61 sigma."""
    lr, depth = parse_value(knobs["LR"]), parse_value(knobs["DEPTH"])
    return 1.0 + 0.05 * (math.log10(lr) + 2) ** 2 + 0.002 * (depth - 8) ** 2


@pytest.mark.parametrize("name", ["greedy", "factorial", "optuna", "pattern", "surface"])
def test_loop_keeps_real_gains(name: str) -> None:
    lab = FakeLab(bowl, {"LR": "0.001", "DEPTH": "2"}, sigma=0.002)
    start = bowl(lab.incumbent)
    lines: list[str] = []
    result = lab.loop(
        make_strategy(name, LOOP_DIMS, seed=3), wave_size=4, waves=8, on_wave=lambda s: lines.append(s.line())
    )
    assert result.stopped in ("waves", "converged") and len(lines) == len(result.waves)
    assert lab.adopted, "a 61-sigma gain was never kept"
    assert bowl(result.incumbent) < start - 0.05
    # Every adoption was a true improvement over the incumbent it replaced.
    previous = start
    for obs in lab.adopted:
        assert bowl(obs.knobs) < previous
        previous = bowl(obs.knobs)
    assert result.incumbent == lab.incumbent
    assert any("adopted" in line for line in lines)


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("greedy", {"step": 0.5, "min_step": 0.1}),
        ("factorial", {"step": 0.5, "min_step": 0.1}),
        ("pattern", {"step": 0.5, "min_step": 0.1}),
        ("surface", {"first_step": 0.5, "min_radius": 0.1}),
    ],
)
def test_loop_does_not_keep_gains_inside_the_noise(name: str, options: dict) -> None:
    def nearly_flat(knobs: dict[str, str]) -> float:  # the best corner is 0.5 sigma better
        return 1.0 - 0.0005 * LOOP_DIMS[0].coded(parse_value(knobs["LR"]))

    lab = FakeLab(nearly_flat, {"LR": "0.01", "DEPTH": "7"}, sigma=0.002)
    result = lab.loop(make_strategy(name, LOOP_DIMS, **options), wave_size=4, waves=6)
    assert lab.adopted == []
    assert result.incumbent == {"LR": "0.01", "DEPTH": "7"}
    assert {s.verdict for s in result.waves} <= {"within-noise", "discard"}


def test_loop_budget_deadline_and_resume() -> None:
    with pytest.raises(UsageError, match="--waves N or --hours H"):
        FakeLab(bowl, {"LR": "0.001", "DEPTH": "2"}, 0.002).loop(GreedyStrategy(LOOP_DIMS), wave_size=2)
    with pytest.raises(UsageError, match="at least 1"):
        FakeLab(bowl, {"LR": "0.001", "DEPTH": "2"}, 0.002).loop(
            GreedyStrategy(LOOP_DIMS), wave_size=0, waves=1
        )

    ticks = iter(range(100))
    lab = FakeLab(bowl, {"LR": "0.001", "DEPTH": "2"}, 0.002)
    result = lab.loop(GreedyStrategy(LOOP_DIMS), wave_size=2, deadline=3, clock=lambda: next(ticks))
    assert (len(result.waves), result.stopped) == (3, "deadline")

    # Interrupted after submitting wave 3: resume waits for it, then runs up to 5 waves in all.
    lab = FakeLab(bowl, {"LR": "0.001", "DEPTH": "2"}, 0.002)
    first = lab.loop(GreedyStrategy(LOOP_DIMS), wave_size=2, waves=2)
    history = [o for s in first.waves for o in (s.best,) if o is not None]
    lab.submit([{"LR": "0.002"}], 2)
    resumed = lab.loop(
        GreedyStrategy(LOOP_DIMS), wave_size=2, waves=5, waves_done=2, history=history, resume_wave="w003"
    )
    assert [s.index for s in resumed.waves] == [2, 3, 4]
    assert resumed.waves[0].wave_id == "w003" and resumed.waves[0].proposed == 1
    assert resumed.stopped == "waves"


def test_loop_first_wave_size_leaves_room_for_runs_in_flight() -> None:
    lab = FakeLab(bowl, {"LR": "0.001", "DEPTH": "2"}, 0.002)
    seen: list[tuple[dict[str, str], int]] = []

    class Recording(PatternStrategy):
        def observe_incumbent(self, knobs, values):
            seen.append((dict(knobs), len(values)))
            super().observe_incumbent(knobs, values)

    result = lab.loop(Recording(LOOP_DIMS), wave_size=4, first_wave_size=1, waves=3)
    assert [s.proposed for s in result.waves] == [1, 4, 4]
    # before each proposal, and again once each wave is judged (the figure may have grown meanwhile)
    assert len(seen) == 6
    # a design that cannot be cut to the smaller size (a two-level fraction) gets the whole wave
    dims = [parse_space(f"K{i}=uniform(0,1)") for i in range(5)]
    lab = FakeLab(lambda knobs: 1.0, {f"K{i}": "0.5" for i in range(5)}, 0.002)
    result = lab.loop(FactorialStrategy(dims), wave_size=8, first_wave_size=5, waves=1)
    assert [s.proposed for s in result.waves] == [8]


def test_min_wave_says_how_small_a_wave_a_strategy_fills() -> None:
    five = [parse_space(f"K{i}=uniform(0,1)") for i in range(5)]
    assert FactorialStrategy(five).min_wave == 8  # the 2^(5-2) resolution III fraction
    assert FactorialStrategy(five[:2]).min_wave == 4  # the full 2^2
    for name in ("greedy", "optuna", "pattern", "surface"):
        assert make_strategy(name, five).min_wave == 1
    # what min_wave promises is what the design does
    incumbent = {f"K{i}": "0.5" for i in range(5)}
    assert len(FactorialStrategy(five).propose(incumbent, [], 8)) == 8
    with pytest.raises(UsageError, match="too small"):
        FactorialStrategy(five).propose(incumbent, [], 7)


def test_loop_lets_a_real_error_in_propose_surface() -> None:
    """An error raised by `propose` reaches the caller: the loop no longer retries a wave with
    more runs when propose raises (it asks `min_wave` instead), which hid such errors."""
    lab = FakeLab(bowl, {"LR": "0.001", "DEPTH": "2"}, 0.002)
    calls: list[int] = []

    class Broken(PatternStrategy):
        def propose(self, incumbent, history, k):
            calls.append(k)
            if len(calls) == 1:
                raise UsageError("the strategy's own bug")
            return super().propose(incumbent, history, k)

    with pytest.raises(UsageError, match="own bug"):
        lab.loop(Broken(LOOP_DIMS), wave_size=4, first_wave_size=2, waves=2)
    assert calls == [2]  # asked once, with the smaller size; not retried with the whole wave
    # a wave too small for the design's block, asked of the strategy, is still a usage error
    dims = [parse_space(f"K{i}=uniform(0,1)") for i in range(5)]
    flat = FakeLab(lambda knobs: 1.0, {f"K{i}": "0.5" for i in range(5)}, 0.002)
    with pytest.raises(UsageError, match="raise --wave-size to 8"):
        flat.loop(FactorialStrategy(dims), wave_size=4, waves=1)


def test_loop_all_crashed_wave_and_converged_stop() -> None:
    lab = FakeLab(bowl, {"LR": "0.01", "DEPTH": "8"}, 0.002)
    lab.wait = lambda wave_id: [Observation(i, k, None) for i, k in lab.waves[wave_id]]
    lines: list[str] = []
    result = lab.loop(
        FactorialStrategy(LOOP_DIMS, step=0.5, min_step=0.2),
        wave_size=4,
        waves=10,
        on_wave=lambda s: lines.append(s.line()),
    )
    assert result.stopped == "converged" and len(result.waves) == 2
    assert lines[0] == "w001 (search wave 1): 0/4 runs, 4 crashed"


def test_loop_counts_degraded_runs_apart_and_keeps_them_from_the_strategy() -> None:
    lab = FakeLab(bowl, {"LR": "0.01", "DEPTH": "8"}, 0.002)
    measured = lab.wait

    def starved_first(wave_id: str) -> list[Observation]:
        # the first run starved: recorded without a value, and re-run once with the same knobs
        first, *rest = measured(wave_id)
        again = Observation(f"{first.id}r", first.knobs, first.value)
        return [Observation(first.id, first.knobs, None, degraded=True), again, *rest]

    lab.wait = starved_first
    told: list[list[Observation]] = []

    class Watched(PatternStrategy):
        def tell(self, observations):
            told.append(list(observations))

    lines: list[str] = []
    result = lab.loop(Watched(LOOP_DIMS), wave_size=4, waves=1, on_wave=lambda s: lines.append(s.line()))
    [summary] = result.waves
    assert (summary.proposed, summary.finished, summary.crashed, summary.degraded) == (4, 4, 0, 1)
    assert "4/4 runs, 1 degraded (starved machine; re-run once)" in lines[0] and "crashed" not in lines[0]
    assert not [o for batch in told for o in batch if o.degraded]  # before: a crash at those knobs


def test_importing_search_loads_no_heavy_library() -> None:
    import subprocess
    import sys

    code = (
        "import sys, nightlab.search, nightlab.search.strategies; "
        "print(sorted(m for m in ('numpy', 'scipy', 'optuna', 'statsmodels', 'pyDOE3', 'matplotlib', 'torch') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_strategy_modules_import_only_the_shared_base() -> None:
    """No cycle: each strategy module builds on `_base` alone (surface.py once imported the
    strategies module's private helpers while that module imported surface.py for its factory)."""
    import ast
    from pathlib import Path

    import nightlab.search.strategies as package

    folder = Path(package.__file__).parent
    for name in ("factorial", "greedy", "bayesian", "pattern", "surface"):
        tree = ast.parse((folder / f"{name}.py").read_text())
        imported = {
            node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith("nightlab.search.strategies")
        }
        assert imported == {"nightlab.search.strategies._base"}, name


def test_pattern_runs_the_pattern_move_after_an_adoption() -> None:
    # issue 34 item 5: after a wave that adopted, the new point moved on by the adoption's
    # displacement (Hooke-Jeeves' pattern move), twice, all knobs at once; the wave after it still
    # fits the stencil around the new point (the pattern move is left out of it)
    incumbent = {"X": "0.5", "Y": "1.0", "Z": "0.5"}
    strategy = PatternStrategy(PATTERN_DIMS, step=0.25)
    first = strategy.propose(incumbent, [], 16)
    best = min(first, key=bowl3)
    assert best == {"X": "0.5", "Y": "0.75", "Z": "0.5"}  # Y down one step: -0.5 coded
    history = [Observation(f"e{i}", r, bowl3(r), wave=0, adopted=r == best) for i, r in enumerate(first)]
    strategy.observe_incumbent(incumbent, [bowl3(incumbent)] * 2)  # as `run_loop`: before each wave
    strategy.observe_incumbent(best, [bowl3(best)] * 2)
    second = strategy.propose(best, history, 16)
    point = {"X": "0.7", "Y": "0.3", "Z": "0.5"}  # the fitted minimum
    move = {"X": "0.7", "Y": "0.05", "Z": "0.5"}  # Y -0.4 coded, moved on by -0.5
    assert second[:4] == [point, point, move, move]
    assert all(sum(r[n] != point[n] for n in "XYZ") == 1 for r in second[4:])
    wave1 = [Observation(f"f{i}", r, bowl3(r), wave=1, adopted=i == 0) for i, r in enumerate(second)]
    strategy.observe_incumbent(point, [bowl3(point)] * 2)
    third = strategy.propose(point, history + wave1, 16)
    # the stencil around the point was read (the pattern move left out): nothing left to follow,
    # the point has its two runs, and the next pattern move goes on from it
    again = {"X": "0.9", "Y": "0.0", "Z": "0.5"}  # +0.4 and -0.9 coded, Y clipped at its edge
    assert third[:2] == [again, again]
    assert all(sum(r[n] != point[n] for n in "XYZ") == 1 for r in third[2:])
    # this move changed two knobs: the wave after it reads its stencil without it, and so does a
    # resumed search (a new strategy, the past incumbents replayed), which reads it from the runs
    runs = history + wave1 + [Observation(f"g{i}", r, bowl3(r), wave=2) for i, r in enumerate(third)]
    centre, read = strategy._last_stencil(runs)
    assert centre == point and again not in [o.knobs for o in read] and len(read) == len(third) - 2
    resumed = PatternStrategy(PATTERN_DIMS, step=0.25)
    for past in (incumbent, best, point, point):
        resumed.observe_incumbent(past, [bowl3(past)] * 2)
    assert resumed._last_stencil(runs) == (centre, read)
    # off: no pattern move; and none after a wave that adopted nothing
    plain = PatternStrategy(PATTERN_DIMS, step=0.25, momentum=False)
    plain.observe_incumbent(incumbent, [bowl3(incumbent)] * 2)
    plain.observe_incumbent(best, [bowl3(best)] * 2)
    assert move not in plain.propose(best, history, 16)
    idle = PatternStrategy(PATTERN_DIMS, step=0.25)
    idle.observe_incumbent(incumbent, [bowl3(incumbent)] * 2)
    idle.observe_incumbent(incumbent, [bowl3(incumbent)] * 2)
    unadopted = [Observation(o.id, o.knobs, o.value, wave=0) for o in history]
    wave = idle.propose(incumbent, unadopted, 16)
    assert wave[:4] == [point, point, best, best] and move not in wave  # the point, the carried best
    assert all(sum(r[n] != point[n] for n in "XYZ") == 1 for r in wave[4:])
