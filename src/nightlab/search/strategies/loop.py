"""`run_loop`, the research loop of `nightlab search` as pure logic over callables.

Propose a wave, submit it, wait, pick and judge the winner, adopt it, repeat until the wave budget
or the deadline is spent. The caller supplies the ledger-backed callables (nightlab.search_loop for a lab,
bench/search_family.py and bench/search_standin.py for in-memory ones), so the loop itself is
tested with in-memory fakes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from nightlab.errors import UsageError
from nightlab.search.strategies._base import BaseStrategy, Knobs, Observation

__all__ = ["LoopResult", "WaveSummary", "run_loop"]


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
    degraded: int = 0  # runs the machine starved: not crashes; the fleet re-runs each once

    def line(self, metric: str = "metric") -> str:
        # the ledger's wave id first: `nightlab waves w002` shows this wave, whatever its place in
        # the search (the noise floor's wave may come before the first one)
        text = f"{self.wave_id} (search wave {self.index + 1}): {self.finished}/{self.proposed} runs"
        if self.crashed:
            text += f", {self.crashed} crashed"
        if self.degraded:
            text += f", {self.degraded} degraded (starved machine; re-run once)"
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
            round (the noise floor's repeats); `wave_size` when None, or when it is below
            `strategy.min_wave`.
        submit_wave: (proposals, wave index) -> wave id; runs the proposals on top of the incumbent.
        wait_wave: wave id -> its finished runs as Observations (blocks until all finished);
            degraded ones are counted in the summary and kept from the strategy.
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
            spent = _budget_spent(waves, index, deadline, clock)
            if spent is not None:
                stopped = spent
                break
            if incumbent_values is not None:
                strategy.observe_incumbent(current, incumbent_values())
            size = _wave_size(strategy, wave_size, first_wave_size, first=not summaries)
            proposals = strategy.propose(current, past, size)
            if not proposals:
                break
            pending, proposed = submit_wave(proposals, index), len(proposals)
        else:
            proposed = 0  # a resumed wave: its size is what comes back
        returned = [replace(o, wave=index) for o in wait_wave(pending)]
        summary, current, observations = _close_wave(
            strategy,
            returned,
            index=index,
            wave_id=pending,
            proposed=proposed,
            current=current,
            decide=decide,
            adopt=adopt,
            incumbent_values=incumbent_values,
        )
        past += observations
        summaries.append(summary)
        if on_wave is not None:
            on_wave(summary)
        index += 1
        pending = None
    return LoopResult(tuple(summaries), current, stopped)


def _budget_spent(
    waves: int | None, index: int, deadline: float | None, clock: Callable[[], float]
) -> str | None:
    """Why no new wave starts ("waves", "deadline"), None while the budget lasts."""
    if waves is not None and index >= waves:
        return "waves"
    if deadline is not None and clock() >= deadline:
        return "deadline"
    return None


def _wave_size(strategy: BaseStrategy, wave_size: int, first_wave_size: int | None, *, first: bool) -> int:
    """Proposals in the next wave: `first_wave_size` for this call's first wave when the strategy can
    run that few, else `wave_size`."""
    size = wave_size if first_wave_size is None or not first else first_wave_size
    if size < strategy.min_wave:
        # the strategy's design needs a whole block (a two-level fraction): the runs in
        # flight (the noise floor's repeats) queue behind a full wave instead
        size = wave_size
    return size


def _close_wave(
    strategy: BaseStrategy,
    returned: list[Observation],
    *,
    index: int,
    wave_id: str,
    proposed: int,
    current: Knobs,
    decide: Decide,
    adopt: Adopt,
    incumbent_values: Callable[[], Sequence[float]] | None,
) -> tuple[WaveSummary, Knobs, list[Observation]]:
    """Tell the strategy a wave's runs, judge it and adopt its winner; returns the wave's summary,
    the incumbent after it and the wave's observations (the adopted one marked)."""
    # a degraded run says nothing about its knobs (its re-run, in the wave, does)
    observations = [o for o in returned if not o.degraded]
    degraded = len(returned) - len(observations)
    proposed = proposed or len(observations)
    strategy.tell(observations)
    winner, verdict = decide(wave_id, observations)
    if incumbent_values is not None:
        # the figure it was judged against now holds runs that finished with the wave (the
        # noise floor's repeats, settle runs), which a resumed search would also see
        strategy.observe_incumbent(current, incumbent_values())
    if winner is not None:
        adopt(winner)
        current = {**current, **winner.knobs}
        observations = [replace(o, adopted=o.id == winner.id) for o in observations]
    finished = [o for o in observations if o.value is not None]
    best = None
    if finished:
        pick = min if strategy.lower_is_better else max
        best = pick(finished, key=lambda o: o.value)
    summary = WaveSummary(
        index=index,
        wave_id=wave_id,
        proposed=proposed,
        finished=len(finished),
        crashed=len(observations) - len(finished),
        best=best,
        adopted=winner,
        verdict=verdict,
        degraded=degraded,
    )
    return summary, current, observations
