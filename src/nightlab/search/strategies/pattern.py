"""The `pattern` strategy: parallel coordinate search with a per-knob quadratic step (a parallel greedy)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from nightlab.errors import UsageError
from nightlab.search.decide import pooled_sd
from nightlab.search.knobs import parse_value
from nightlab.search.spaces import Choice, Dimension
from nightlab.search.strategies._base import (
    Knobs,
    Observation,
    _key,
    _since_adoption,
    _SteppedStrategy,
    replicate_groups,
    stencil,
)

__all__ = ["PatternStrategy"]


class PatternStrategy(_SteppedStrategy):
    """Parallel coordinate search with a per-knob quadratic step (a parallel greedy).

    The first wave is a stencil around the incumbent: each knob `step` coded units up and down,
    the others kept (+step and +2 step, or -step and -2 step, at an edge of the space); when that
    does not fit in the wave, every knob gets one run first (towards the middle of its range) and
    the other sides fill the slots left (`cover`), so no knob waits a wave to be measured. Each wave
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
    A keep needs two runs on each side, so a stencil point that wins on its one run is within the
    noise: the last wave's best by mean, when it beats the incumbent's figure (the one the wave
    adopted, if any) and is not the new centre, gets two more runs in the next wave (`carry`),
    judged there with the others, instead of a settle round in which most workers wait
    (`settles_in_next_wave`: `nightlab search` then skips its settle round). While that best is
    unsettled the incumbent is the old one, whose stencil was measured already: when the last
    centre crashed, or its fit points nowhere, the next wave explores from the unsettled best
    instead (two more runs of it and a stencil around it; `explore`). Stencils try every
    other level of a list knob (`all_levels`) and, near an edge, the edge itself (`to_edge`).
    The step halves after every `patience` waves without an adoption; the search stops below
    `min_step`. Knobs that act together (a learning rate whose best value moves with the weight
    decay) are crossed in a zig-zag, one knob-wise step per wave: a quadratic with interactions
    fitted on the last stencils, and a secant update of the interactions, were tried on
    bench/search_sim.py and did not help (the fits were not convex or overshot). After a wave that
    adopted, the wave also runs Hooke-Jeeves' pattern move twice (`momentum`): the new point moved
    on by the adoption's displacement, all knobs at once, in place of one stencil knob (never the
    stencil's last two); the next wave reads the stencil without it (after a resume, the moves
    are read from the runs: `_moves_in`). Further
    points along the fitted move (x2, x3, x0.5) and a wider stencil while adoptions keep coming
    were measured on bench/search_family.py's dev set and not kept (bench/RESULTS.md, session 35).

    Args:
        step: the stencil's half-width in coded units ([-1, +1] is the space).
        min_step: stop proposing once the step falls below this.
        reach: how far the fitted step may go, in stencil half-widths.
        replicas: runs of each new centre.
        patience: waves without an adoption before the step halves.
        carry: run the repeats of a wave's unsettled best with the next wave (see above).
        all_levels: a list knob's stencil takes every other level, not the first two.
        to_edge: a knob less than a step from an edge is measured at the edge.
        explore: centre the wave on the unsettled best when the last centre gives no step.
        cover: an opening wave too small for the stencil measures every knob once first.
        momentum: after an adoption, also run the new point moved on by its displacement (twice).
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
        carry: bool = True,
        all_levels: bool = True,
        to_edge: bool = True,
        explore: bool = True,
        cover: bool = True,
        momentum: bool = True,
    ) -> None:
        super().__init__(dims, lower_is_better=lower_is_better, seed=seed, step=step, min_step=min_step)
        if replicas < 1 or patience < 1:
            raise UsageError(f"replicas `{replicas}` and patience `{patience}` must be at least 1")
        self.reach, self.replicas, self.carry = reach, replicas, carry
        self.all_levels, self.to_edge, self.explore = all_levels, to_edge, explore
        self.cover = cover
        self.patience = patience
        self.momentum = momentum
        self._moves: set[tuple] | None = None  # the last wave's pattern moves; None: not proposed here
        self._figures: dict[tuple, list[float]] = {}
        self._incumbents: list[Knobs] = []  # every incumbent seen, for the centre of a 1-knob stencil

    def settles_in_next_wave(self, k: int) -> bool:
        # the carried best's two runs must fit beside the new centre's replicas: in a smaller
        # wave they were cut off, and a within-noise best never got its repeat (issue 32)
        return self.carry and k >= self.replicas + 2

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
        moves = self._moves if self._moves is not None else self._moves_in(runs, history, last)
        if moves:  # a pattern move changes many knobs at once: not part of the stencil
            runs = [o for o in runs if _key(o.knobs, self.dims) not in moves] or runs
        found = self._stencil_of(runs, history, last)
        if found is None:
            # the repeats of a carried configuration (`_unsettled`) were measured in an earlier
            # wave: the stencil is the rest of the wave
            earlier = {_key(o.knobs, self.dims) for o in history if o.wave < last}
            rest = [o for o in runs if _key(o.knobs, self.dims) not in earlier]
            if rest and len(rest) < len(runs):
                found = self._stencil_of(rest, history, last)
        return found

    def _moves_in(self, runs: Sequence[Observation], history: Sequence[Observation], last: int) -> set[tuple]:
        """The pattern moves of a wave this strategy did not propose (a resumed search), read from
        the runs: after a wave that adopted, a configuration new in the wave, run twice, that differs
        in more than one knob from a point run once (the centre differs from each in one). A move
        along the only knob the stencil probed passes for a stencil point there."""
        if not any(o.adopted for o in history if o.wave == last - 1):
            return set()
        earlier = {_key(o.knobs, self.dims) for o in history if o.wave < last}
        counts = Counter(_key(o.knobs, self.dims) for o in runs)
        once = [o.knobs for o in runs if counts[_key(o.knobs, self.dims)] == 1]
        return {
            _key(o.knobs, self.dims)
            for o in runs
            if counts[_key(o.knobs, self.dims)] >= 2
            and _key(o.knobs, self.dims) not in earlier
            and any(
                sum(parse_value(o.knobs[d.name]) != parse_value(p[d.name]) for d in self.dims) > 1
                for p in once
            )
        }

    def _stencil_of(
        self, runs: Sequence[Observation], history: Sequence[Observation], last: int
    ) -> tuple[Knobs, list[Observation]] | None:
        """The centre of these runs and the runs, when each moved at most one knob from it."""
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
        tie = any(len(c) > 1 and c[0][1] == c[1][1] for c in counts.values())
        if tie or all(_key(o.knobs, self.dims) == _key(centre, self.dims) for o in runs):
            # a knob's centre value is not the most common one (one knob probed, the centre not run in
            # the wave), or every run is the majority (a wave of one run): the centre is the
            # configuration every run differs from in exactly one knob
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
        return (centre, list(runs)) if moved else None

    def _stencil(self, centre: Mapping[str, str], step: float, names: Sequence[str]) -> list[Knobs]:
        return stencil(self.dims, centre, step, names, all_levels=self.all_levels, to_edge=self.to_edge)

    def _opening(self, centre: Mapping[str, str], step: float, names: Sequence[str], k: int) -> list[Knobs]:
        """The first wave: the stencil around `centre`, or, when it does not fit in `k` runs and
        `cover` is on, one run per knob first (every knob measured once) and the other sides in
        the slots left, knob by knob.

        Two runs a knob leave the knobs past the first k/2 unmeasured until the second wave; with
        one, the fit of a one-run knob goes as far as its run when that run is better.
        """
        full = self._stencil(centre, step, names)
        if not self.cover or len(full) <= k:
            return full[:k]
        first: list[Knobs] = []
        rest: list[Knobs] = []
        for name in names:
            runs = self._stencil(centre, step, [name])
            if len(runs) > 1 and not isinstance(self._dim(name), Choice):
                dim = self._dim(name)
                c = dim.coded(parse_value(centre[name]))
                sides = {dim.coded(parse_value(r[name])) > c for r in runs}
                near_edge = self.to_edge and (step / 4 < 1 - c < step or step / 4 < c + 1 < step)
                if len(sides) == 2 and not near_edge:  # towards the middle, where more of the space lies
                    runs.sort(key=lambda r: abs(dim.coded(parse_value(r[name]))))
            first += runs[:1]
            rest += runs[1:]
        return (first + rest)[:k]

    def _dim(self, name: str) -> Dimension:
        return next(d for d in self.dims if d.name == name)

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
            elif y_best < -2 * noise:  # a run crashed or one side only (`cover`): as far as the better run
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
        self._moves = set()
        if last is None:  # the first wave, or after a resume: a stencil around the incumbent
            return self._opening(incumbent, step, names, k)
        centre, runs = last
        figure = self._values_at(_key(centre, self.dims), history)
        # the last wave's unsettled best: with `carry` the next wave explores from it, since the
        # incumbent's own stencil was measured already (it would only reuse those runs)
        carry = self.settles_in_next_wave(k)
        provisional = self._unsettled(incumbent, history, set()) if carry and self.explore else None
        if not figure:  # the centre crashed: a stencil around the best there is
            if provisional is None:
                return self._stencil(incumbent, step, names)[:k]
            return ([provisional, provisional] + self._stencil(provisional, step, names))[:k]
        f0 = sum(figure) / len(figure)
        fitted = self._fitted_step(centre, runs, f0, self._noise(history))
        point = dict(centre)
        for name, (value, _) in fitted.items():
            dim = next(d for d in self.dims if d.name == name)
            point[name] = dim.to_source(value)
        settling = False
        if _key(point, self.dims) == _key(centre, self.dims):  # nothing to follow: back to the best
            point, settling = dict(provisional or incumbent), provisional is not None
        have = len(self._values_at(_key(point, self.dims), history))
        repeats = 2 if settling else max(self.replicas - have, 0)  # an unsettled best gets its runs
        if repeats == 1 and have:  # one more run would ask for seed 0 again, which is measured
            repeats = 2
        if have and not carry:  # a wave too small for two more runs: the loop's settle round runs them
            repeats = 0
        # Knobs the last stencil left out come first, then the ones with the most to gain.
        probed = {
            n
            for n in names
            if len({repr(parse_value(o.knobs[n])) for o in runs} - {repr(parse_value(centre[n]))})
            >= (1 if isinstance(self._dim(n), Choice) else 2)
        }  # a range knob measured on one side only (the opening's `cover`) counts as left out
        order = sorted(names, key=lambda n: (n in probed, -fitted.get(n, (None, 0.0))[1]))
        best = self._unsettled(incumbent, history, {_key(point, self.dims)}) if carry else None
        carried = [] if best is None else [best, best]
        moves = self._pattern_move(incumbent, centre, point, carried) if carry and not settling else []
        if k - repeats - len(carried) - 2 * len(moves) < 4:  # not at the cost of the stencil's last two knobs
            moves = []
        self._moves = {_key(q, self.dims) for q in moves}
        per_knob = max(1, (k - repeats - len(carried) - 2 * len(moves)) // 2)
        around = self._stencil(point, step, order[:per_knob])
        twice = {_key(c, self.dims) for c in (*carried, *moves)}
        around = [p for p in around if _key(p, self.dims) not in twice]
        if not carry:  # a wave of a run or two: a point measured already would only be reused
            around = [p for p in around if not self._values_at(_key(p, self.dims), history)]
        return ([point] * repeats + carried + [q for q in moves for _ in range(2)] + around)[:k]

    def _pattern_move(
        self, incumbent: Mapping[str, str], centre: Mapping[str, str], point: Knobs, carried: Sequence[Knobs]
    ) -> list[Knobs]:
        """Hooke-Jeeves' pattern move (`momentum`): when the last wave adopted, the new point moved
        on by that adoption's displacement (coded units; list knobs as the adoption set them).

        Knobs that act together are crossed in a zig-zag, one knob-wise step a wave; two steps in a
        row point along the valley, and the move tries one more of them at once. It is empty when
        the last wave adopted nothing or the move lands on a point the wave runs anyway.
        """
        if not self.momentum or len(self._incumbents) < 2:
            return []
        before, now = self._incumbents[-2], self._incumbents[-1]
        if _key(before, self.dims) == _key(now, self.dims) or _key(now, self.dims) != _key(
            incumbent, self.dims
        ):
            return []
        q = self._shifted(point, before, now)
        taken = {_key(c, self.dims) for c in (centre, point, *carried)}
        return [] if _key(q, self.dims) in taken else [q]

    def _shifted(
        self, start: Mapping[str, str], centre: Mapping[str, str], point: Mapping[str, str]
    ) -> Knobs:
        """`start` moved by the coded move from `centre` to `point` (list knobs as at `point` where it moved them)."""
        out = {d.name: start[d.name] for d in self.dims}
        for dim in self.dims:
            a, b = parse_value(centre[dim.name]), parse_value(point[dim.name])
            if a == b:
                continue
            if isinstance(dim, Choice):
                out[dim.name] = point[dim.name]
            else:
                c = dim.coded(parse_value(start[dim.name])) + dim.coded(b) - dim.coded(a)
                out[dim.name] = dim.to_source(dim.from_coded(c))
        return out

    def _unsettled(
        self, incumbent: Mapping[str, str], history: Sequence[Observation], skip: set
    ) -> Knobs | None:
        """The last wave's best configuration by mean when that mean beats the incumbent's figure
        (the incumbent it adopted, if it did): it gets two more runs in the next wave.

        A keep needs two runs on each side, so a stencil point that wins on one run is within the
        noise. The loop's settle round would run its repeat while 14 of 16 workers wait; carried
        into the next wave (listed twice: one snapshot, two fresh seeds) it costs two slots, and
        the wave judges it against the incumbent with the wave's other candidates. A wave whose
        fitted point was kept can still hold a better one-run point: it is carried too (the
        settle round only ever settled a best that was not kept).
        """
        last = max(o.wave for o in history)
        runs = [o for o in history if o.wave == last]
        groups = replicate_groups(history, self.dims, self._figures)
        figure = groups.get(_key(incumbent, self.dims), [])
        if not figure:
            return None
        sign = 1.0 if self.lower_is_better else -1.0
        f_inc = sum(figure) / len(figure)
        gains: dict[tuple, tuple[float, Knobs]] = {}
        for o in runs:
            key = _key(o.knobs, self.dims)
            values = groups.get(key, [])
            if o.value is None or not values or key == _key(incumbent, self.dims):
                continue
            gain = sign * (f_inc - sum(values) / len(values))
            if gain > 0:
                gains[key] = (gain, {d.name: o.knobs[d.name] for d in self.dims})
        if not gains:
            return None
        key, (_, knobs) = max(gains.items(), key=lambda item: item[1][0])
        # only the wave's best, as the settle round; none when it is the next point (measured anyway)
        return None if key in skip else knobs
