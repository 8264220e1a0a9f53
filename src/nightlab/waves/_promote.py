"""Promotions: re-running screened candidates on another tier, chosen by the judge's rule."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from nightlab.analysis import ok_values
from nightlab.errors import UsageError
from nightlab.ledger import Experiment, Source
from nightlab.waves._read import wave_status
from nightlab.waves._submit import SubmittedWave, _incumbent_runs, _incumbent_stale, submit_incumbent

if TYPE_CHECKING:
    from nightlab.lab import Lab


def promote(
    lab: Lab,
    ids: Sequence[str],
    *,
    tier: str,
    repeats: int = 2,
    description: str | None = None,
    screen: Mapping[str, float] | None = None,
    start_controller: bool = True,
) -> SubmittedWave:
    """`nightlab promote`: re-run the snapshots of `ids` on `tier` with `repeats` seeds each.

    The incumbent gets runs on `tier` too when it has fewer than `repeats` there (or they are
    stale), so the candidates can be judged on that tier.

    Raises:
        UsageError: no ids, a tier without workers (the existing tiers are named), an id already
            on that tier.
    """
    if not ids:
        raise UsageError("name the experiments to promote, e.g. `nightlab promote e0007 --tier h200`")
    tier = lab.check_tier(tier)
    sources = [lab.ledger.get(i) for i in ids]
    for e in sources:
        if e.tier == tier:
            raise UsageError(
                f"{e.id} already ran on tier `{tier}`; promote to another tier, or repeat it with "
                f"`nightlab submit --from {e.id} --repeats {repeats}`"
            )
    metric = lab.config.metric.name
    head = lab.incumbent()
    if screen is None:
        screen = {}
        for e in sources:
            values = ok_values(lab.ledger.experiments(identity=e.identity, tier=e.tier), metric)
            if values:
                screen[e.id] = statistics.fmean(values)
    wave = lab.ledger.add_wave(
        design="promote",
        description=description or f"promote {', '.join(ids)} to {tier}",
        spec={"promoted": {}, "screen": dict(screen), "screen_tiers": {e.id: e.tier for e in sources}},
        tier=tier,
        base_snapshot=head.commit,
    )
    queued: list[Experiment] = []
    incumbent = _incumbent_runs(lab, tier, head.identity)
    if _incumbent_stale(lab, tier, head.identity) or len(incumbent) < repeats:
        queued += submit_incumbent(
            lab, tier, wave.id, max(1, repeats - len(incumbent)), lab.files_at(head.commit)
        )
    promoted: dict[str, list[str]] = {}
    for e in sources:
        files, base = lab.files_of(e.id)
        exps = lab.submit(
            f"promote {e.id}: {e.description}",
            overrides=dict(files),
            base=base,
            tier=tier,
            repeats=repeats,
            fresh_seeds=True,
            wave=wave.id,
            source=Source.PROMOTE,
            start_controller=False,
        )
        promoted[e.id] = [x.id for x in exps]
        queued += exps
    spec = {**wave.spec, "promoted": promoted}
    lab.ledger.update_wave_spec(wave.id, spec)
    if start_controller and queued:
        from nightlab.fleet.daemon import ensure_running

        ensure_running(lab.path)
    return SubmittedWave(lab.ledger.wave(wave.id), tuple(queued))


def promote_wave(
    lab: Lab,
    wave_id: str,
    *,
    tier: str,
    repeats: int = 2,
    top_k: int | None = None,
    start_controller: bool = True,
) -> SubmittedWave:
    """Screen-and-promote: promote the top k candidates of a screened wave that beat the incumbent.

    Which candidates qualify is `Judge.screened`'s rule (verdict `keep` or `within-noise` on the
    wave's tier; the best `k`, `[search] promote_top_k`, by mean), the same the search loop uses.
    They go to `tier` with `repeats` runs each.

    Raises:
        UsageError: the wave is still running, or none of its candidates beat the incumbent.
    """
    status = wave_status(lab, wave_id)
    if status.pending:
        raise UsageError(
            f"wave `{wave_id}` has {status.pending} runs still pending; wait for it first "
            f"(`nightlab wait {' '.join(e.id for e in status.runs if not e.status.is_finished())}`)"
        )
    k = top_k if top_k is not None else lab.config.search.promote_top_k
    screened = lab.judge().screened(status.candidates, k)
    if not screened.chosen:
        raise UsageError(
            f"no candidate of wave `{wave_id}` beat the incumbent on tier `{status.wave.tier}`; nothing to promote"
        )
    chosen, means = screened.chosen, screened.means
    return promote(
        lab,
        chosen,
        tier=tier,
        repeats=repeats,
        description=f"promote top {len(chosen)} of {wave_id} to {tier}",
        screen={i: means[i] for i in chosen},
        start_controller=start_controller,
    )
