"""The lab's search loop (`nightlab search`): the strategies of `nightlab.search` run on a lab.

`nightlab.search` is pure logic with no lab; this package is the loop that drives it through the
ledger and the fleet (it was `nightlab.research` before issue 33, a name that said neither).

`search.strategies.run_loop` is the loop as pure logic; this module supplies its callables:

- submit: a wave of proposals around the incumbent (`waves.submit_wave`), on the screening tier
  when there is one, else on the validation tier;
- wait: block until the wave's runs end; with a screening tier, the wave is enrolled in
  asynchronous successive halving (`nightlab.rungs`): the controller promotes a candidate up the
  rungs as soon as its run ends in the top 1/eta of what its rung has seen and ahead of the
  incumbent there (at most `top_k` per wave), and the loop waits for the promoted runs too;
- optionally (`effects_step`), after a factorial wave, the point its significant main effects
  predict (every knob with a significant effect at its better level, the others as they are) is
  measured too, in the same wave: the best corner of a fraction moves every knob, right or wrong.
  It costs a round per wave; in bench/search_sim.py it won some waves and lost others;
- decide: `Judge.best_of_wave` on the validation tier, with that tier's noise floor and
  z corrected for the number of candidates; a `within-noise` best first gets the repeats that would
  settle it (once per wave, when they fit in one round; with no floor, the runs a keep needs and
  those of a floor); only a `keep` is adopted;
- every wait follows the re-run of each run that ends degraded (the controller queues it in the
  same wave): a degraded run is counted apart from crashes and kept from the strategy;
- adopt: `Lab.adopt` with the tier it was decided on; the judge (`Judge.adopted`) gives the
  winner's runs there the verdict `keep`.

Before the first wave the noise floor of the validation tier is measured when there is none
(`FLOOR_REPEATS` runs of the incumbent, alongside the first wave): without it a single run cannot
be judged. When those runs fail, it is measured again alongside the next wave, until it is.

Resuming: every wave the loop submits has a `SearchProgress` record in the ledger with the search's
identity (strategy, spaces, tiers), its index, and once judged the verdict and the adopted run; each
change to it is one transaction (`Ledger.update_search_progress`). Running the
same command again rebuilds the history from those waves, waits for a wave that was submitted
but not judged, completes an adoption that was decided but not done, and goes on; `--waves N`
counts the waves of earlier runs, `--hours H` starts from now.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from nightlab.errors import UsageError
from nightlab.search_loop._loop import SearchPlan, WaitProgress, _LabLoop, tier_slots
from nightlab.waves import head_knobs, parse_spaces

if TYPE_CHECKING:
    from nightlab.lab import Lab

__all__ = ["SearchPlan", "WaitProgress", "_LabLoop", "run_search", "tier_slots"]


def run_search(
    lab: Lab,
    *,
    strategy: str,
    spaces: Sequence[str],
    waves: int | None = None,
    hours: float | None = None,
    wave_size: int | None = None,
    tier: str | None = None,
    screen_tier: str | None = None,
    top_k: int | None = None,
    repeats: int = 2,
    sampler: str = "tpe",
    seed: int = 0,
    settle: bool = True,
    effects_step: bool = False,
    # 50 ms: the loop sees a wave's last run end within ~0.05 s (bench/search_overhead.py: at 0.2 s
    # the poll was a third of the 1.2 s between waves on a loaded 2-core box); one ledger read a poll
    poll: float = 0.05,
    on_wave: Callable[[Any], None] | None = None,
    note: Callable[[str], None] = lambda _: None,
    progress: Callable[[WaitProgress], None] | None = None,
) -> Any:
    """`nightlab search`: run (or resume) the automatic research loop in the foreground.

    Args:
        strategy: `factorial`, `optuna`, `greedy`, `pattern` or `surface`.
        spaces: `NAME=...` search spaces over knobs of the incumbent.
        waves: total waves of this search, earlier runs of the same search included.
        hours: stop starting new waves after this many hours from now.
        wave_size: proposals per wave (default: 1 for greedy, else the slots of the wave's tier).
        tier: the validation tier (default: fleet.default_tier).
        screen_tier: run each wave here first (a screening rung: a cheaper tier, or a shorter
            budget) and promote its top 1/eta, as runs end, up to `tier` (`nightlab.rungs`).
        top_k: at most this many candidates promoted per wave (default `[search] promote_top_k`).
        repeats: runs of each promoted candidate on `tier`.
        sampler: `tpe` or `gp` for the optuna strategy.
        settle: whether the best of a wave that is within the noise gets the repeats that would
            settle it, once per wave, when they fit in one round of the validation tier (at least 4).
            `pattern` runs them with its next wave instead (`settles_in_next_wave`: waves of 4 or
            more), without a screening tier. With no noise floor, the best gets the runs a keep needs
            and the incumbent those of a floor (`decide.runs_without_floor`).
        effects_step: after each factorial wave, also run the combination its significant main
            effects predict (one more round of up to 4 runs); see `_LabLoop.effects_step`.
        on_wave: called with each wave's `WaveSummary`.
        note: receives progress lines for people (noise floor, resumed waves, unsettled bests).
        progress: called on every poll while the search waits for runs, with a `WaitProgress`.

    Returns:
        The `search.strategies.LoopResult`.

    Raises:
        UsageError: no budget, a bad space, strategy or tier (the existing tiers are named).
    """
    from nightlab.search.strategies import make_strategy, run_loop

    if waves is None and hours is None:
        raise UsageError("the search needs a budget: give --waves N or --hours H")
    dims = parse_spaces(lab, spaces)
    plan, options = _plan(
        lab,
        strategy,
        dims,
        tier=tier,
        screen_tier=screen_tier,
        wave_size=wave_size,
        top_k=top_k,
        repeats=repeats,
        sampler=sampler,
        settle=settle,
        effects_step=effects_step,
    )
    size = plan.wave_size
    loop = _LabLoop(lab, plan, dims, poll=poll, note=note, progress=progress)
    loop.finish_adoption()
    history, done, pending = loop.replay()
    if done or pending:
        note(f"resuming: {done} waves judged" + (f", waiting for {pending}" if pending else ""))
    in_flight = loop.start_noise_floor()
    # A resumed Optuna study replays the history, but its random draws follow the seed alone.
    search = make_strategy(strategy, dims, seed=seed + len(history), **options)
    for past, values in loop.past_incumbents():
        search.observe_incumbent(past, values)
    knobs = head_knobs(lab)
    return run_loop(
        search,
        incumbent={d.name: knobs[d.name].source for d in dims},
        wave_size=size,
        # the repeats share the first wave's round when both run on the validation tier
        first_wave_size=max(1, size - in_flight) if in_flight and not (pending or screen_tier) else None,
        submit_wave=loop.submit,
        wait_wave=loop.wait,
        decide=loop.decide,
        adopt=loop.adopt,
        waves=waves,
        deadline=None if hours is None else time.time() + hours * 3600,
        history=history,
        waves_done=done,
        resume_wave=pending,
        on_wave=on_wave,
        incumbent_values=lambda: loop.judge.values(lab.head_identity(), plan.tier),
    )


def _plan(
    lab: Lab,
    strategy: str,
    dims: list[Any],
    *,
    tier: str | None,
    screen_tier: str | None,
    wave_size: int | None,
    top_k: int | None,
    repeats: int,
    sampler: str,
    settle: bool,
    effects_step: bool,
) -> tuple[SearchPlan, dict[str, Any]]:
    """Check the tiers and the strategy before anything runs; returns the search's plan and the
    strategy's options."""
    from nightlab.search.strategies import make_strategy

    tier = lab.check_tier(tier or lab.config.fleet.default_tier)
    if screen_tier is not None:
        lab.check_tier(screen_tier)
        if screen_tier == tier:
            raise UsageError(f"the screening tier `{screen_tier}` is the validation tier; name a cheaper one")
    options: dict[str, Any] = {"lower_is_better": lab.config.metric.lower_is_better}
    if strategy == "optuna":
        options["sampler"] = sampler
    checked = make_strategy(strategy, dims, **options)  # a bad name or option fails before anything runs
    size = wave_size or (1 if strategy == "greedy" else max(1, tier_slots(lab, screen_tier or tier)))
    plan = SearchPlan(
        strategy=strategy,
        spaces=tuple(d.spec() for d in dims),
        tier=tier,
        screen_tier=screen_tier,
        wave_size=size,
        top_k=top_k if top_k is not None else lab.config.search.promote_top_k,
        repeats=repeats,
        # pattern runs a within-noise best's repeats with its next wave: no round for them alone
        # (with a screening tier, promoted candidates get their repeats on the validation tier)
        settle=settle and not (checked.settles_in_next_wave(size) and screen_tier is None),
        effects_step=effects_step,
    )
    return plan, options
