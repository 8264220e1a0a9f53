"""The `factorial` strategy: two-level designs centred on the incumbent, shrinking while nothing wins."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from nightlab.search.designs import Design, min_two_level_runs, two_level_design
from nightlab.search.spaces import Choice
from nightlab.search.strategies._base import (
    Knobs,
    Observation,
    _choice_position,
    _since_adoption,
    _step_value,
    _SteppedStrategy,
)

__all__ = ["FactorialStrategy"]


class FactorialStrategy(_SteppedStrategy):
    """Two-level designs centred on the incumbent, shrinking while nothing wins.

    Args:
        step: half the distance between the two levels, in coded units ([-1, +1] is the space).
        min_step: stop proposing once the step falls below this.
    """

    name = "factorial"

    @property
    def min_wave(self) -> int:
        """The runs of the smallest two-level design over the searched knobs (a resolution III fraction)."""
        return min_two_level_runs(len(self.dims))

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
