"""Search strategies and the automatic research loop, as pure logic over callables.

A strategy turns the incumbent's knobs and the history of finished runs into the next wave of
proposals (knob -> source text for the searched knobs only; everything else stays as in the
incumbent). Strategies keep no state that the history cannot rebuild, so a search interrupted
at any point resumes by handing a fresh strategy the history from the ledger:

- `FactorialStrategy`: a two-level design (full, or the highest-resolution fraction that fits the
  wave) centred on the incumbent at +-step in coded units; the step halves after every wave
  without an adoption and the search stops once it falls below `min_step`.
- `OptunaStrategy`: Optuna's TPE (with the constant liar) or GP sampler through ask-and-tell, k
  trials in flight at once, results told back as they arrive. On resume the history is replayed
  into a fresh in-memory study with `add_trial`, so no Optuna storage needs to be kept.
- `GreedyStrategy`: the autoresearch baseline, a sequential one-knob-at-a-time hill climb: try
  each knob one step up and one step down from the incumbent; after all moves at a step failed,
  halve the step.
- `PatternStrategy`: the parallel counterpart of greedy, with a model step. Every wave is a
  stencil: each knob one step up and one step down from a centre (8 knobs: 16 runs). A parabola
  per knob through the centre's figure and its two stencil points gives the next centre (each
  knob at its fitted minimum), which the next wave measures twice, with a stencil around it on
  the knobs that fit in the rest of the wave. The predicted point is measured with repeats: one
  of its runs alone would be a lucky-run figure once adopted.
- `surface.SurfaceStrategy` (its own module): a quadratic model with interactions fitted on every
  run, pair corners to measure the interactions, and a trust region.

`run_loop` is `nightlab search`: propose a wave, submit it, wait, pick and judge the winner,
adopt it, repeat until the wave budget or the deadline is spent. The caller supplies the
ledger-backed callables, so the loop itself is tested with in-memory fakes.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from nightlab.errors import UsageError
from nightlab.search.decide import pooled_sd
from nightlab.search.designs import Design, two_level_design
from nightlab.search.knobs import parse_value
from nightlab.search.spaces import Choice, Dimension, IntRange, LogUniform, Pow2, Uniform

__all__ = [
    "BaseStrategy",
    "FactorialStrategy",
    "GreedyStrategy",
    "LoopResult",
    "Observation",
    "OptunaStrategy",
    "PatternStrategy",
    "WaveSummary",
    "make_strategy",
    "run_loop",
]

Knobs = dict[str, str]


@dataclass(frozen=True)
class Observation:
    """One finished run of a proposal.

    Attributes:
        id: the experiment id.
        knobs: the searched knobs' source text in this run.
        value: the metric; None for a crashed or invalid run.
        wave: index of the wave the run belonged to (0-based, in search order).
        adopted: whether this run's knobs became the incumbent.
    """

    id: str
    knobs: Knobs
    value: float | None
    wave: int = 0
    adopted: bool = False


def _key(knobs: Mapping[str, str], dims: Sequence[Dimension]) -> tuple:
    """Identity of a configuration: the searched knobs' values (so `2**4` equals `16`)."""
    return tuple(repr(parse_value(knobs[d.name])) if d.name in knobs else None for d in dims)


def _since_adoption(history: Sequence[Observation]) -> list[Observation]:
    """Observations from waves after the last adoption (earlier ones judged another incumbent)."""
    last = max((o.wave for o in history if o.adopted), default=-1)
    return [o for o in history if o.wave > last]


class BaseStrategy(ABC):
    """What every strategy implements.

    `propose` returns up to `k` distinct proposals for the next wave, or an empty list when the
    strategy has nothing left to try (converged or exhausted). It must depend only on its
    arguments and the constructor's, plus what `tell` was given, so that replaying the history
    into a fresh instance resumes the search. `tell` receives runs as they finish; strategies
    that derive everything from `history` need not override it.
    """

    name: ClassVar[str]

    def __init__(self, dims: Sequence[Dimension], *, lower_is_better: bool = True, seed: int = 0) -> None:
        if not dims:
            raise UsageError("a search needs at least one space, e.g. --space `MATRIX_LR=log(0.01,0.08)`")
        self.dims = tuple(dims)
        self.lower_is_better = lower_is_better
        self.seed = seed

    @abstractmethod
    def propose(self, incumbent: Mapping[str, str], history: Sequence[Observation], k: int) -> list[Knobs]:
        """Up to `k` distinct proposals (searched knob -> source text)."""

    def tell(self, observations: Sequence[Observation]) -> None:  # noqa: B027 - optional hook
        """Receive finished runs."""

    def observe_incumbent(self, knobs: Mapping[str, str], values: Sequence[float]) -> None:  # noqa: B027
        """Receive the incumbent's metric values on the validation tier (its figure), before `propose`."""

    def _incumbent_value(self, dim: Dimension, incumbent: Mapping[str, str]) -> object:
        if dim.name not in incumbent:
            raise UsageError(f"the incumbent has no knob `{dim.name}`; check the --space names")
        return parse_value(incumbent[dim.name])


def _choice_position(dim: Choice, value: object) -> int | None:
    try:
        return dim.index(value)
    except UsageError:
        return None


def _step_value(dim: Dimension, current: object, direction: int, step: float) -> object:
    """The value `step` coded units from `current` in `direction` (+1 / -1), moving at least one notch."""
    if isinstance(dim, Choice):
        i = _choice_position(dim, current)
        j = (0 if direction > 0 else len(dim.sources) - 1) if i is None else i + direction
        return dim.values[min(max(j, 0), len(dim.sources) - 1)]
    c = dim.coded(current)
    value = dim.from_coded(c + direction * step)
    s = step
    # Integer scales can round a small step back onto the current value: widen until it moves.
    while value == current and s < 2.0:
        s *= 2
        value = dim.from_coded(c + direction * s)
    return value


class _SteppedStrategy(BaseStrategy):
    """A strategy that moves knobs by a step (in coded units) and stops below `min_step`."""

    def __init__(
        self,
        dims: Sequence[Dimension],
        *,
        lower_is_better: bool = True,
        seed: int = 0,
        step: float = 0.5,
        min_step: float = 1 / 16,
    ) -> None:
        super().__init__(dims, lower_is_better=lower_is_better, seed=seed)
        self.step, self.min_step = step, min_step


class FactorialStrategy(_SteppedStrategy):
    """Two-level designs centred on the incumbent, shrinking while nothing wins.

    Args:
        step: half the distance between the two levels, in coded units ([-1, +1] is the space).
        min_step: stop proposing once the step falls below this.
    """

    name = "factorial"

    def design(self, incumbent: Mapping[str, str], history: Sequence[Observation], k: int) -> Design | None:
        """The next wave's design (its coded levels feed `effects`), or None once converged."""
        misses = len({o.wave for o in _since_adoption(history)})
        step = self.step / 2**misses
        if step < self.min_step:
            return None
        local: list[Choice] = []
        for dim in self.dims:
            current = self._incumbent_value(dim, incumbent)
            if isinstance(dim, Choice):
                i = _choice_position(dim, current)
                if i is None:
                    low, high = dim.values[0], dim.values[1]
                else:  # the incumbent against another value, a different one each wave
                    others = [v for j, v in enumerate(dim.values) if j != i]
                    low, high = current, others[misses % len(others)]
            else:
                c = dim.coded(current)
                lo_c, hi_c = c - step, c + step
                if lo_c < -1.0:
                    lo_c, hi_c = -1.0, -1.0 + 2 * step
                elif hi_c > 1.0:
                    lo_c, hi_c = 1.0 - 2 * step, 1.0
                low, high = dim.from_coded(lo_c), dim.from_coded(hi_c)
                if low == high:
                    low = _step_value(dim, high, -1, step)
                    if low == high:
                        high = _step_value(dim, low, +1, step)
            local.append(Choice(dim.name, (dim.to_source(low), dim.to_source(high))))
        if any(d.sources[0] == d.sources[1] for d in local):
            return None  # a knob has no room left to move
        return two_level_design(local, max_runs=k)

    def propose(self, incumbent: Mapping[str, str], history: Sequence[Observation], k: int) -> list[Knobs]:
        design = self.design(incumbent, history, k)
        return [] if design is None else list(design.runs)


class GreedyStrategy(_SteppedStrategy):
    """One knob at a time, one step up and one step down from the incumbent (autoresearch's loop).

    Args:
        step: the move, in coded units.
        min_step: stop once every move at a step below this has been tried.
    """

    name = "greedy"

    def _moves(self, incumbent: Mapping[str, str], step: float) -> list[Knobs]:
        moves = []
        for dim in self.dims:
            current = self._incumbent_value(dim, incumbent)
            for direction in (+1, -1):
                value = _step_value(dim, current, direction, step)
                if value != current:
                    moves.append({dim.name: dim.to_source(value)})
        return moves

    def propose(self, incumbent: Mapping[str, str], history: Sequence[Observation], k: int) -> list[Knobs]:
        # Every configuration measured so far is settled: earlier incumbents included.
        tried = {_key({**incumbent, **o.knobs}, self.dims) for o in history}
        step = self.step
        out: list[Knobs] = []
        keys: set[tuple] = set()
        while step >= self.min_step and len(out) < k:
            for move in self._moves(incumbent, step):
                key = _key({**incumbent, **move}, self.dims)
                if key not in tried and key not in keys and len(out) < k:
                    out.append(move)
                    keys.add(key)
            step /= 2
        return out


def _distribution(dim: Dimension) -> Any:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if isinstance(dim, Choice):
        return CategoricalDistribution(list(dim.sources))
    if isinstance(dim, Pow2):  # searched on the exponent
        return IntDistribution(int(math.log2(dim.lo)), int(math.log2(dim.hi)))
    if isinstance(dim, IntRange):
        return IntDistribution(int(dim.lo), int(dim.hi))
    if isinstance(dim, (Uniform, LogUniform)):
        return FloatDistribution(float(dim.lo), float(dim.hi), log=isinstance(dim, LogUniform))
    raise TypeError(f"no Optuna distribution for {type(dim).__name__}")


def _param_to_source(dim: Dimension, param: Any) -> str:
    if isinstance(dim, Choice):
        return str(param)
    if isinstance(dim, Pow2):
        return f"2**{int(param)}"
    if isinstance(dim, IntRange):
        return str(int(param))
    return dim.to_source(float(param))


def _source_to_param(dim: Dimension, source: str) -> Any | None:
    """The Optuna parameter of a knob value, or None when it lies outside the space."""
    value = parse_value(source)
    if isinstance(dim, Choice):
        i = _choice_position(dim, value)
        return None if i is None else dim.sources[i]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not dim.lo <= value <= dim.hi:  # type: ignore[attr-defined]
        return None
    if isinstance(dim, Pow2):
        exponent = math.log2(value)
        return int(exponent) if exponent.is_integer() else None
    if isinstance(dim, IntRange):
        return int(value) if float(value).is_integer() else None
    return float(value)


class OptunaStrategy(BaseStrategy):
    """Bayesian optimisation through Optuna's ask-and-tell interface.

    Args:
        sampler: `tpe` (TPESampler, multivariate, constant liar: trials in flight count as
            already measured at a pessimistic value, so a batch spreads out) or `gp` (GPSampler,
            which conditions on running trials itself).
        n_startup_trials: random trials before the model takes over.
    """

    name = "optuna"

    def __init__(
        self,
        dims: Sequence[Dimension],
        *,
        lower_is_better: bool = True,
        seed: int = 0,
        sampler: str = "tpe",
        n_startup_trials: int = 8,
    ) -> None:
        super().__init__(dims, lower_is_better=lower_is_better, seed=seed)
        if sampler not in ("tpe", "gp"):
            raise UsageError(f"unknown sampler `{sampler}`; use tpe or gp")
        self.sampler = sampler
        self.n_startup_trials = n_startup_trials
        self._study: Any = None
        self._pending: dict[tuple, Any] = {}
        self._told: set[str] = set()

    @property
    def study(self) -> Any:
        """The in-memory Optuna study (created on first use)."""
        if self._study is None:
            import optuna

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            if self.sampler == "tpe":
                sampler = optuna.samplers.TPESampler(
                    seed=self.seed,
                    multivariate=True,
                    constant_liar=True,
                    n_startup_trials=self.n_startup_trials,
                )
            else:
                sampler = optuna.samplers.GPSampler(seed=self.seed, n_startup_trials=self.n_startup_trials)
            direction = "minimize" if self.lower_is_better else "maximize"
            self._study = optuna.create_study(sampler=sampler, direction=direction)
        return self._study

    def tell(self, observations: Sequence[Observation]) -> None:
        """Tell finished runs: pending trials are completed, unknown ones (a resume) added."""
        from optuna.trial import TrialState, create_trial

        distributions = {d.name: _distribution(d) for d in self.dims}
        for obs in observations:
            if obs.id in self._told:
                continue
            self._told.add(obs.id)
            key = _key(obs.knobs, self.dims)
            state = TrialState.COMPLETE if obs.value is not None else TrialState.FAIL
            if key in self._pending:
                trial = self._pending.pop(key)
                self.study.tell(trial, obs.value if obs.value is not None else None, state=state)
                continue
            params = {d.name: _source_to_param(d, obs.knobs.get(d.name, "None")) for d in self.dims}
            if any(p is None for p in params.values()):
                continue  # measured outside the space (e.g. the starting incumbent): nothing to learn
            self.study.add_trial(
                create_trial(params=params, distributions=distributions, value=obs.value, state=state)
            )

    def propose(self, incumbent: Mapping[str, str], history: Sequence[Observation], k: int) -> list[Knobs]:
        from optuna.trial import TrialState

        self.tell(history)
        distributions = {d.name: _distribution(d) for d in self.dims}
        out: list[Knobs] = []
        # A small space runs out of new points: give up after 20 duplicate draws per wanted trial.
        for _ in range(20 * k):
            if len(out) == k:
                break
            trial = self.study.ask(distributions)
            knobs = {d.name: _param_to_source(d, trial.params[d.name]) for d in self.dims}
            key = _key(knobs, self.dims)
            if key in self._pending:
                self.study.tell(trial, state=TrialState.FAIL)  # a duplicate: drop it from the study
                continue
            self._pending[key] = trial
            out.append(knobs)
        return out


def stencil(
    dims: Sequence[Dimension], centre: Mapping[str, str], step: float, names: Sequence[str]
) -> list[Knobs]:
    """Each named knob `step` coded units up and down from `centre` (one-sided at an edge).

    At an edge the two runs go the other way (+step and +2 step, or -step and -2 step); an
    integer knob that rounds back onto its value is widened until it moves; a list knob takes
    the first two other values. Configurations equal to the centre or to each other are dropped.
    """
    out: list[Knobs] = []
    keys = {_key(centre, dims)}
    for dim in dims:
        if dim.name not in names:
            continue
        current = parse_value(centre[dim.name])
        if isinstance(dim, Choice):
            values = [v for v in dim.values if v != current][:2]
        else:
            c = dim.coded(current)
            if c + step > 1:
                offsets: tuple[float, float] = (-step, -2 * step)
            elif c - step < -1:
                offsets = (step, 2 * step)
            else:
                offsets = (step, -step)
            values = []
            for o in offsets:
                value = dim.from_coded(c + o)
                if value == current:  # an integer knob rounded back: widen until it moves
                    value = _step_value(dim, current, 1 if o > 0 else -1, abs(o))
                values.append(value)
        for value in values:
            run = {**centre, dim.name: dim.to_source(value)}
            key = _key(run, dims)
            if key not in keys:
                out.append(run)
                keys.add(key)
    return out


def replicate_groups(
    history: Sequence[Observation], dims: Sequence[Dimension], figures: Mapping[tuple, Sequence[float]]
) -> dict[tuple, list[float]]:
    """Metric values per configuration: the history's finished runs, or the incumbent figure handed
    to `observe_incumbent` where that has more runs (it includes the noise floor's repeats)."""
    groups: dict[tuple, list[float]] = {}
    for o in history:
        if o.value is not None:
            groups.setdefault(_key(o.knobs, dims), []).append(o.value)
    for key, values in figures.items():
        if values and len(values) >= len(groups.get(key, [])):
            groups[key] = list(values)
    return groups


class PatternStrategy(_SteppedStrategy):
    """Parallel coordinate search with a per-knob quadratic step (a parallel greedy).

    The first wave is a stencil around the incumbent: each knob `step` coded units up and down,
    the others kept (+step and +2 step, or -step and -2 step, at an edge of the space). Each wave
    after it fits, per knob, a parabola through the last stencil's two points on that knob and
    its centre's figure, and moves every knob to the parabola's minimum (at most `reach` stencil
    widths away; past the better point when the fit is not convex; with a crashed stencil run,
    only as far as the measured point that was better). A
    knob whose stencil shows neither a curvature nor a gain above twice the noise (the pooled sd
    of repeated configurations) stays where it is. The new point is the next centre: the wave
    measures it `replicas` times plus a stencil around it on as many knobs as the wave has room
    for, knobs the last stencil left out first, then those with the largest predicted gain.

    So every wave both follows the model and measures what the next step needs; the loop judges
    the centre (a mean of `replicas` runs) against the stencil points like any other candidates.
    The step halves after every `patience` waves without an adoption; the search stops below
    `min_step`. Knobs that act together (a learning rate whose best value moves with the weight
    decay) are crossed in a zig-zag, one knob-wise step per wave: a quadratic with interactions
    fitted on the last stencils, and a secant update of the interactions, were tried on
    bench/search_sim.py and did not help (the fits were not convex or overshot).

    Args:
        step: the stencil's half-width in coded units ([-1, +1] is the space).
        min_step: stop proposing once the step falls below this.
        reach: how far the fitted step may go, in stencil half-widths.
        replicas: runs of each new centre.
        patience: waves without an adoption before the step halves.
    """

    name = "pattern"

    def __init__(
        self,
        dims: Sequence[Dimension],
        *,
        lower_is_better: bool = True,
        seed: int = 0,
        step: float = 0.25,
        min_step: float = 1 / 32,
        reach: float = 4.0,
        replicas: int = 2,
        patience: int = 2,
    ) -> None:
        super().__init__(dims, lower_is_better=lower_is_better, seed=seed, step=step, min_step=min_step)
        if replicas < 1 or patience < 1:
            raise UsageError(f"replicas `{replicas}` and patience `{patience}` must be at least 1")
        self.reach, self.replicas = reach, replicas
        self.patience = patience
        self._figures: dict[tuple, list[float]] = {}
        self._incumbents: list[Knobs] = []  # every incumbent seen, for the centre of a 1-knob stencil

    def observe_incumbent(self, knobs: Mapping[str, str], values: Sequence[float]) -> None:
        self._figures[_key(knobs, self.dims)] = list(values)
        self._incumbents.append(dict(knobs))

    def _values_at(self, key: tuple, history: Sequence[Observation]) -> list[float]:
        return replicate_groups(history, self.dims, self._figures).get(key, [])

    def _last_stencil(self, history: Sequence[Observation]) -> tuple[Knobs, list[Observation]] | None:
        """The last wave's centre and runs when it was a stencil (each run moved at most one knob)."""
        if not history:
            return None
        last = max(o.wave for o in history)
        runs = [o for o in history if o.wave == last]
        if any(any(d.name not in o.knobs for d in self.dims) for o in runs):
            return None
        counts = {
            d.name: Counter(repr(parse_value(o.knobs[d.name])) for o in runs).most_common(2)
            for d in self.dims
        }
        centre = {
            d.name: next(
                o.knobs[d.name] for o in runs if repr(parse_value(o.knobs[d.name])) == counts[d.name][0][0]
            )
            for d in self.dims
        }
        if any(len(c) > 1 and c[0][1] == c[1][1] for c in counts.values()):
            # a knob's centre value is not the most common one (one knob probed, the centre not run in
            # the wave): the centre is the configuration every run differs from in exactly one knob
            known = [*reversed(self._incumbents), *(o.knobs for o in history if o.wave < last)]
            centre = next(
                (
                    dict(c)
                    for c in known
                    if all(d.name in c for d in self.dims)
                    and all(
                        sum(parse_value(o.knobs[d.name]) != parse_value(c[d.name]) for d in self.dims) == 1
                        for o in runs
                    )
                ),
                {},
            )
            if not centre:
                return None
        moved = set()
        for o in runs:
            diff = [d.name for d in self.dims if parse_value(o.knobs[d.name]) != parse_value(centre[d.name])]
            if len(diff) > 1:
                return None
            moved.update(diff)
        return (centre, runs) if moved else None

    def _noise(self, history: Sequence[Observation]) -> float:
        return pooled_sd(replicate_groups(history, self.dims, self._figures).values())[0] or 0.0

    def _fitted_step(
        self, centre: Knobs, runs: Sequence[Observation], f0: float, noise: float
    ) -> dict[str, tuple[object, float]]:
        """Per knob: (the value the fit points to, the predicted gain), for knobs worth moving.

        A knob whose stencil shows neither a curvature nor a gain above twice the noise stays:
        near the optimum a weak knob's fit is noise, and following it would undo earlier gains.
        """
        sign = 1.0 if self.lower_is_better else -1.0
        out: dict[str, tuple[object, float]] = {}
        for dim in self.dims:
            here = parse_value(centre[dim.name])
            axis = [o for o in runs if parse_value(o.knobs[dim.name]) != here]
            if not axis:
                continue
            if isinstance(dim, Choice):
                ok = [o for o in axis if o.value is not None and sign * (o.value - f0) < -2 * noise]
                if ok:
                    best = min(ok, key=lambda o: sign * o.value)
                    out[dim.name] = (parse_value(best.knobs[dim.name]), sign * (f0 - best.value))
                continue
            c0 = dim.coded(here)
            points = [(dim.coded(parse_value(o.knobs[dim.name])) - c0, o.value) for o in axis]
            points = [(x, y) for x, y in points if x != 0]  # both clipped to one edge: no slope to see
            if not points:
                continue
            fit = [(0.0, 0.0)] + [(x, sign * (y - f0)) for x, y in points if y is not None]
            span = max(abs(x) for x, _ in points)
            x_best, y_best = min(fit, key=lambda p: p[1])
            move, gain = 0.0, 0.0
            if len(fit) >= 3:
                (x1, y1), (x2, y2) = fit[1], fit[2]
                a = (y1 / x1 - y2 / x2) / (x1 - x2) if x1 != x2 else 0.0
                b = y1 / x1 - a * x1
                if a * span * span > 2 * noise:
                    move = max(-self.reach * span, min(self.reach * span, -b / (2 * a)))
                    gain = -(b * move + a * move * move)
                elif y_best < -2 * noise:  # no curvature to trust: go past the better point
                    move, gain = 2 * x_best, -y_best
            elif y_best < -2 * noise:  # a stencil run crashed: only as far as the better measured point
                move, gain = x_best, -y_best
            value = dim.from_coded(c0 + move)
            if value != here and gain > 0:
                out[dim.name] = (value, gain)
        return out

    def propose(self, incumbent: Mapping[str, str], history: Sequence[Observation], k: int) -> list[Knobs]:
        misses = len({o.wave for o in _since_adoption(history)})
        step = self.step / 2 ** (misses // self.patience)
        if step < self.min_step:
            return []
        names = [d.name for d in self.dims]
        last = self._last_stencil(history)
        if last is None:  # the first wave, or after a resume: a stencil around the incumbent
            return stencil(self.dims, incumbent, step, names)[:k]
        centre, runs = last
        figure = self._values_at(_key(centre, self.dims), history)
        if not figure:
            return stencil(self.dims, incumbent, step, names)[:k]
        f0 = sum(figure) / len(figure)
        fitted = self._fitted_step(centre, runs, f0, self._noise(history))
        point = dict(centre)
        for name, (value, _) in fitted.items():
            dim = next(d for d in self.dims if d.name == name)
            point[name] = dim.to_source(value)
        if _key(point, self.dims) == _key(centre, self.dims):  # nothing to follow: back to the incumbent
            point = dict(incumbent)
        have = len(self._values_at(_key(point, self.dims), history))
        repeats = max(self.replicas - have, 0)
        if repeats == 1 and have:  # one more run would ask for seed 0 again, which is measured
            repeats = 2
        # Knobs the last stencil left out come first, then the ones with the most to gain.
        probed = {n for n in names if any(parse_value(o.knobs[n]) != parse_value(centre[n]) for o in runs)}
        order = sorted(names, key=lambda n: (n in probed, -fitted.get(n, (None, 0.0))[1]))
        per_knob = max(1, (k - repeats) // 2)
        around = stencil(self.dims, point, step, order[:per_knob])
        return ([point] * repeats + around)[:k]


def make_strategy(name: str, dims: Sequence[Dimension], **options: Any) -> BaseStrategy:
    """The strategy called `name` (`factorial`, `optuna`, `greedy`, `pattern`, `surface`).

    Raises:
        UsageError: an unknown name.
    """
    from nightlab.search.surface import SurfaceStrategy  # it builds on this module

    for cls in (FactorialStrategy, OptunaStrategy, GreedyStrategy, PatternStrategy, SurfaceStrategy):
        if cls.name == name:
            return cls(dims, **options)
    raise UsageError(f"unknown strategy `{name}`; use factorial, optuna, greedy, pattern or surface")


# --- the research loop ----------------------------------------------------------------------


@dataclass(frozen=True)
class WaveSummary:
    """What one wave of the loop did; `line()` is what `nightlab search` prints."""

    index: int
    wave_id: str
    proposed: int
    finished: int
    crashed: int
    best: Observation | None
    adopted: Observation | None
    verdict: str | None

    def line(self, metric: str = "metric") -> str:
        text = f"wave {self.index + 1} {self.wave_id}: {self.finished}/{self.proposed} runs"
        if self.crashed:
            text += f", {self.crashed} crashed"
        if self.best is not None and self.best.value is not None:
            text += f", best {metric} {self.best.value:.6f} ({self.best.id})"
        if self.adopted is not None:
            text += f", adopted {self.adopted.id}"
        elif self.verdict is not None:
            text += f", {self.verdict}"
        return text


@dataclass(frozen=True)
class LoopResult:
    """The end of `run_loop`: every wave it ran, the final incumbent and why it stopped."""

    waves: tuple[WaveSummary, ...]
    incumbent: Knobs
    stopped: str  # "waves", "deadline" or "converged"


SubmitWave = Callable[[list[Knobs], int], str]
WaitWave = Callable[[str], list[Observation]]
Decide = Callable[[str, list[Observation]], tuple[Observation | None, str | None]]
Adopt = Callable[[Observation], None]


def run_loop(
    strategy: BaseStrategy,
    *,
    incumbent: Mapping[str, str],
    wave_size: int,
    first_wave_size: int | None = None,
    submit_wave: SubmitWave,
    wait_wave: WaitWave,
    decide: Decide,
    adopt: Adopt,
    waves: int | None = None,
    deadline: float | None = None,
    history: Sequence[Observation] = (),
    waves_done: int = 0,
    resume_wave: str | None = None,
    on_wave: Callable[[WaveSummary], None] | None = None,
    clock: Callable[[], float] = time.time,
    incumbent_values: Callable[[], Sequence[float]] | None = None,
) -> LoopResult:
    """Run waves until `waves` are done or `deadline` passes: propose, run, judge, adopt.

    Args:
        strategy: proposes each wave.
        incumbent: the searched knobs' source text in the incumbent.
        wave_size: proposals per wave (k).
        first_wave_size: proposals in the first wave this call proposes, when other runs share its
            round (the noise floor's repeats); `wave_size` when None, or when the strategy cannot
            fill a wave that small.
        submit_wave: (proposals, wave index) -> wave id; runs the proposals on top of the incumbent.
        wait_wave: wave id -> its finished runs as Observations (blocks until all finished).
        decide: (wave id, its observations) -> (the run to adopt or None, the verdict word of the
            wave's best run or None). This is where the incumbent's figure, the noise floor, the
            re-measurement of a stale incumbent and `decide.best_of_wave` come in.
        adopt: make an observation's knobs the incumbent (git adoption in the lab).
        waves: total waves of this search, counting the `waves_done` before a resume.
        deadline: a `clock()` time after which no new wave starts.
        history: observations of this search so far (from the ledger, on resume).
        waves_done: waves already finished and judged before a resume.
        resume_wave: the id of a wave submitted before an interruption but not yet judged; it is
            waited for and judged first.
        on_wave: called with each wave's summary (print `summary.line()`).
        clock: the time source for `deadline`.
        incumbent_values: () -> the incumbent's metric values on the validation tier, handed to
            `strategy.observe_incumbent` before each proposal.

    Raises:
        UsageError: neither `waves` nor `deadline` given, or `wave_size` < 1.
    """
    if waves is None and deadline is None:
        raise UsageError("the search needs a budget: give --waves N or --hours H")
    if wave_size < 1:
        raise UsageError(f"--wave-size must be at least 1, got `{wave_size}`")
    current: Knobs = dict(incumbent)
    past = list(history)
    strategy.tell(past)
    summaries: list[WaveSummary] = []
    index = waves_done
    stopped = "converged"
    pending = resume_wave
    while True:
        if pending is None:
            if waves is not None and index >= waves:
                stopped = "waves"
                break
            if deadline is not None and clock() >= deadline:
                stopped = "deadline"
                break
            if incumbent_values is not None:
                strategy.observe_incumbent(current, incumbent_values())
            size = wave_size if first_wave_size is None or summaries else first_wave_size
            try:
                proposals = strategy.propose(current, past, size)
            except UsageError:
                if size == wave_size:
                    raise
                # the strategy's design needs the whole wave (a two-level fraction): the runs
                # in flight queue behind it instead
                proposals = strategy.propose(current, past, wave_size)
            if not proposals:
                break
            pending, proposed = submit_wave(proposals, index), len(proposals)
        else:
            proposed = 0  # a resumed wave: its size is what comes back
        observations = [replace(o, wave=index) for o in wait_wave(pending)]
        proposed = proposed or len(observations)
        strategy.tell(observations)
        winner, verdict = decide(pending, observations)
        if incumbent_values is not None:
            # the figure it was judged against now holds runs that finished with the wave (the
            # noise floor's repeats, settle runs), which a resumed search would also see
            strategy.observe_incumbent(current, incumbent_values())
        if winner is not None:
            adopt(winner)
            current = {**current, **winner.knobs}
            observations = [replace(o, adopted=o.id == winner.id) for o in observations]
        past += observations
        finished = [o for o in observations if o.value is not None]
        best = None
        if finished:
            pick = min if strategy.lower_is_better else max
            best = pick(finished, key=lambda o: o.value)
        summary = WaveSummary(
            index=index,
            wave_id=pending,
            proposed=proposed,
            finished=len(finished),
            crashed=len(observations) - len(finished),
            best=best,
            adopted=winner,
            verdict=verdict,
        )
        summaries.append(summary)
        if on_wave is not None:
            on_wave(summary)
        index += 1
        pending = None
    return LoopResult(tuple(summaries), current, stopped)
