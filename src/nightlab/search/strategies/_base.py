"""What every strategy shares: `Observation`, `BaseStrategy` and the moves the strategies build on.

The helpers here (`_key`, `_step_value`, `stencil`, `replicate_groups`, ...) are package-private:
the strategy modules import them from this one module, so no strategy module imports another
(before the split, `surface.py` imported `strategies.py`'s private helpers while `strategies.py`
imported `surface.py` for its factory: a cycle).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from nightlab.errors import UsageError
from nightlab.search.knobs import parse_value
from nightlab.search.spaces import Choice, Dimension

__all__ = ["BaseStrategy", "Knobs", "Observation", "replicate_groups", "stencil"]

Knobs = dict[str, str]


@dataclass(frozen=True)
class Observation:
    """One finished run of a proposal.

    Attributes:
        id: the experiment id.
        knobs: the searched knobs' source text in this run.
        value: the metric; None for a crashed, invalid or degraded run.
        wave: index of the wave the run belonged to (0-based, in search order).
        adopted: whether this run's knobs became the incumbent.
        degraded: the machine starved the run (recorded, never judged, re-run once): it says
            nothing about its knobs, so `run_loop` keeps it from the strategy.
    """

    id: str
    knobs: Knobs
    value: float | None
    wave: int = 0
    adopted: bool = False
    degraded: bool = False


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

    `min_wave` is the smallest `k` that `propose` can fill (1 unless a design needs a whole
    block of runs); the loop asks it before shrinking a wave, so an error that `propose` raises
    is always a real one and reaches the user.
    """

    name: ClassVar[str]

    def __init__(self, dims: Sequence[Dimension], *, lower_is_better: bool = True, seed: int = 0) -> None:
        if not dims:
            raise UsageError("a search needs at least one space, e.g. --space `MATRIX_LR=log(0.01,0.08)`")
        self.dims = tuple(dims)
        self.lower_is_better = lower_is_better
        self.seed = seed

    @property
    def min_wave(self) -> int:
        """The smallest wave `propose` can fill."""
        return 1

    def settles_in_next_wave(self, k: int) -> bool:
        """Whether the strategy runs the repeats of a within-noise best in its next wave of `k`
        proposals itself, so the loop's settle round (a round for a few runs while the other
        workers wait) is skipped."""
        return False

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


def stencil(
    dims: Sequence[Dimension],
    centre: Mapping[str, str],
    step: float,
    names: Sequence[str],
    *,
    all_levels: bool = False,
    to_edge: bool = False,
) -> list[Knobs]:
    """Each named knob `step` coded units up and down from `centre` (one-sided at an edge).

    At an edge the two runs go the other way (+step and +2 step, or -step and -2 step); an
    integer knob that rounds back onto its value is widened until it moves; a list knob takes
    the first two other values, or every other value with `all_levels` (a list has no order:
    a level the first two never reach could be the best). With `to_edge`, a knob less than a step
    (and more than a quarter step) from an edge is measured at the edge itself and a step the
    other way: a narrow optimum at the edge is otherwise never measured from near it.
    Configurations equal to the centre or to each other are dropped.
    """
    out: list[Knobs] = []
    keys = {_key(centre, dims)}
    for dim in dims:
        if dim.name not in names:
            continue
        current = parse_value(centre[dim.name])
        if isinstance(dim, Choice):
            values = [v for v in dim.values if v != current][: None if all_levels else 2]
        else:
            c = dim.coded(current)
            if to_edge and step / 4 < 1 - c < step:  # near the top edge: the edge itself, and down
                offsets: tuple[float, float] = (1 - c, -step)
            elif to_edge and step / 4 < c + 1 < step:
                offsets = (-1 - c, step)
            elif c + step > 1:
                offsets = (-step, -2 * step)
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
