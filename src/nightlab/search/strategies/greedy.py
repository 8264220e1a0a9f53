"""The `greedy` strategy: autoresearch's sequential one-knob-at-a-time hill climb (the baseline)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from nightlab.search.strategies._base import Knobs, Observation, _key, _step_value, _SteppedStrategy

__all__ = ["GreedyStrategy"]


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
