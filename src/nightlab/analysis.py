"""Per-tier figures and the noise floor, computed from the ledger, and the rows `nightlab results` lists.

The incumbent is the lab's HEAD (`identity.incumbent`); its figure on a tier is the mean of every
ok run of HEAD's research identity on that tier. Verdicts are decided and written by
`nightlab.judge` alone, with the figures from here; they are stored on the experiments so that
the CLI, reports and dashboard all show the same ones.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nightlab import identity
from nightlab.config import LabConfig
from nightlab.ledger import Experiment, ExperimentStatus, Ledger, RankKey, Verdict
from nightlab.search.decide import Figure, pooled_sd


def figure(values: list[float]) -> Figure | None:
    """The `Figure` (mean, sample std, n) of the values, or None when there are none."""
    return Figure.of(values) if values else None


def ok_values(experiments: Iterable[Experiment], metric: str) -> list[float]:
    """The metric of every ok run that reported it."""
    return [v for e in experiments if e.ok and (v := e.metric(metric)) is not None]


def noise_sigma(
    ledger: Ledger, metric: str, tier: str, *, epoch: str | None = None
) -> tuple[float | None, int]:
    """Pooled standard deviation of repeated runs of the same files on `tier`, and its degrees of freedom.

    Only `ok` runs count (a `degraded` one never does); `epoch` keeps it to one comparison epoch
    (`identity.epoch_key`): a new budget or timeout has its own noise.
    """
    # the ranking keys carry all it needs: no row decoded (the judge asks this at every run's end)
    return pooled_sd(repeat_groups(ledger.rank_keys(metric, tier=tier), metric, epoch))


def repeat_groups(
    runs: Iterable[Experiment | RankKey], metric: str, epoch: str | None = None
) -> list[list[float]]:
    """The metric of the ok runs (of one tier) grouped by snapshot: what a noise floor pools.

    `runs` may be decoded experiments or a listing's `RankKey`s (the dashboard's overview pools
    the floor from the keys it ranked, without decoding a row).
    """
    groups: dict[str, list[float]] = {}
    for e in runs:
        v = e.metric(metric)
        if e.ok and v is not None and (epoch is None or e.epoch == epoch):
            groups.setdefault(e.identity, []).append(v)
    return list(groups.values())


def baseline_figures(
    config: LabConfig, experiments: list[Experiment], tiers: list[str]
) -> dict[str, Figure | None]:
    """The baseline's figure per tier: the ok runs of the first snapshot there with verdict `baseline`."""
    metric = config.metric.name
    out: dict[str, Figure | None] = {}
    for t in tiers:
        mine = [e for e in experiments if e.tier == t]
        first = min((e for e in mine if e.verdict == Verdict.BASELINE), key=lambda e: e.seq, default=None)
        out[t] = (
            None
            if first is None
            else figure(ok_values([e for e in mine if e.identity == first.identity], metric))
        )
    return out


@dataclass(frozen=True)
class ResultRow:
    """One experiment as `nightlab results` and the dashboard show it."""

    experiment: Experiment
    value: float | None
    delta: float | None  # value minus the incumbent's mean on the same tier (None when either is missing)
    # its verdict was judged against another incumbent than today's (`Experiment.judged` says which)
    earlier_incumbent: bool = False
    incumbent: bool = False  # a run of today's incumbent: its verdict is history, not a judgement of it
    # judged against today's incumbent when its figure was another (fewer runs): `judged` says which
    earlier_figure: bool = False

    def to_dict(self, metric: str) -> dict:
        e = self.experiment
        return {
            **e.brief(metric),
            "wave": e.wave,
            "snapshot": e.snapshot,
            "delta": self.delta,
            "judged": e.judged_document(),
            "earlier_incumbent": self.earlier_incumbent,
            "earlier_figure": self.earlier_figure,
            "incumbent": self.incumbent,
            "epoch": e.epoch,
            "health": e.health,
            "submitted_at": e.submitted_at,
            "finished_at": e.finished_at,
            "metrics": e.metrics,
        }


@dataclass(frozen=True)
class Ranked:
    """One experiment's place in the results, before its row is decoded (`RankKey` + the comparison)."""

    key: RankKey
    value: float | None
    delta: float | None
    earlier_incumbent: bool = False
    incumbent: bool = False
    earlier_figure: bool = False

    def row(self, experiment: Experiment) -> ResultRow:
        """The decoded row of this place (`experiment` is `key`'s experiment)."""
        return ResultRow(
            experiment, self.value, self.delta, self.earlier_incumbent, self.incumbent, self.earlier_figure
        )


# the verdicts of a comparison against the incumbent (what its figure, moved since, can make stale)
_COMPARED = (Verdict.KEEP, Verdict.WITHIN_NOISE, Verdict.DISCARD)


def _judged_on_another_figure(k: RankKey, inc: Figure | None) -> bool:
    """Whether `k`'s verdict was judged against today's incumbent when its figure was another.

    The judge re-judges `within-noise` and missing verdicts when the incumbent's figure moves,
    never a `keep` or `discard` (`Judge.refresh_pending`): a `discard` judged against one run of
    the incumbent can sit beside a negative delta against its mean of three.
    """
    if inc is None or k.verdict not in _COMPARED or k.judged_n is None or k.judged_mean is None:
        return False
    return k.judged_n != inc.n or not math.isclose(k.judged_mean, inc.mean, rel_tol=1e-12, abs_tol=1e-15)


def ranking(
    ledger: Ledger,
    config: LabConfig,
    lab_dir: Path,
    *,
    tier: str | None = None,
    experiments: list[Experiment] | None = None,
) -> tuple[list[Ranked], dict[str, Figure | None]]:
    """All experiments (optionally of one tier), ok runs best first, then the rest by recency.

    Reads `ledger.rank_keys` only (no row decoded): at 20,000 experiments this is what lets a
    listing rank everything and decode just the rows it shows (`result_rows`).

    `experiments`: the (already decoded) experiments of `tier` to rank instead of reading keys.

    Returns the ranked keys and the incumbent's figure per tier.
    """
    metric = config.metric.name
    if experiments is None:
        keys = ledger.rank_keys(metric, tier=tier)
    else:
        keys = [RankKey.of(e, metric) for e in experiments]
    head_identity = identity.incumbent(lab_dir).identity
    tiers = sorted({k.tier for k in keys} | ({tier} if tier else set()))
    incumbents = {
        t: figure(ok_values([k for k in keys if k.identity == head_identity and k.tier == t], metric))
        for t in tiers
    }
    ranked = []
    current = identity.epoch_key(config)
    for k in keys:
        ok = k.ok
        value = k.value if ok else None
        inc = incumbents.get(k.tier)
        # a run of another comparison epoch was measured differently: no delta against today's incumbent
        comparable = value is not None and inc is not None and k.epoch == current
        mine = k.identity == head_identity
        earlier = k.judged_identity is not None and k.judged_identity != head_identity and not mine
        moved = k.judged_identity == head_identity and not mine and _judged_on_another_figure(k, inc)
        ranked.append(Ranked(k, value, value - inc.mean if comparable else None, earlier, ok and mine, moved))
    sign = 1 if config.metric.lower_is_better else -1
    ok = sorted((r for r in ranked if r.value is not None), key=lambda r: (sign * r.value, r.key.seq))
    rest = sorted((r for r in ranked if r.value is None), key=lambda r: -r.key.seq)
    return ok + rest, incumbents


def result_rows(ledger: Ledger, ranked: list[Ranked], *, tier: str | None = None) -> list[ResultRow]:
    """The experiments of `ranked` decoded, in its order (`tier`: the one `ranked` was read for)."""
    if not ranked:
        return []
    ids = [r.key.id for r in ranked]
    if len(ids) > 500:
        # most of the ledger: one scan of each table beats binding thousands of ids
        wanted = set(ids)
        exps = {e.id: e for e in ledger.experiments(tier=tier) if e.id in wanted}
    else:
        exps = {e.id: e for e in ledger.experiments(ids=ids)}
    return [
        r.row(exps[r.key.id])
        for r in ranked
        if r.key.id in exps  # submitted after the ranking was read: the next listing has it
    ]


def results(
    ledger: Ledger, config: LabConfig, lab_dir: Path, *, tier: str | None = None, limit: int | None = None
) -> tuple[list[ResultRow], dict[str, Figure | None]]:
    """`ranking`'s first `limit` experiments (every one when None) decoded, and the incumbents."""
    if limit is not None:
        ranked, incumbents = ranking(ledger, config, lab_dir, tier=tier)
        return result_rows(ledger, ranked[:limit], tier=tier), incumbents
    rows, _, incumbents = every_result(ledger, config, lab_dir, tier=tier)
    return rows, incumbents


def every_result(
    ledger: Ledger, config: LabConfig, lab_dir: Path, *, tier: str | None = None
) -> tuple[list[ResultRow], list[Ranked], dict[str, Figure | None]]:
    """Every experiment decoded once and ranked from those rows (no second read of the keys)."""
    exps = ledger.experiments(tier=tier)
    ranked, incumbents = ranking(ledger, config, lab_dir, tier=tier, experiments=exps)
    by_id = {e.id: e for e in exps}
    rows = [r.row(by_id[r.key.id]) for r in ranked]
    return rows, ranked, incumbents


@dataclass(frozen=True)
class FleetEfficiency:
    """Share of the held slot time of the latest controller session that went into training."""

    efficiency: float | None
    training_seconds: float
    slot_seconds: float
    slots: int
    since: float
    until: float


def fleet_efficiency(ledger: Ledger) -> FleetEfficiency | None:
    """Training seconds over held slot seconds for the latest controller session (local fleets).

    The window runs from the controller's start to its last heartbeat (or to its stop event
    once it has stopped). Held slot seconds are the registered workers times the window.
    Training seconds: every ok experiment that finished in the window counts its
    `training_seconds` metric (its run time when the target prints none), and every running
    one its elapsed time, both clipped to the window; crashes, timeouts and cancellations
    count nothing, since that slot time was held but wasted. Remote pools that scale to zero
    are counted as held for the whole window, which understates their efficiency.

    Returns:
        The figures, or None when no controller has ever run in this lab.
    """
    session = ledger.controller_session()
    if session is None:
        return None
    since, until = session
    trained = 0.0
    for status, started_at, finished_at, training in ledger.training_spans(since):
        start_ts = max(started_at or since, since)
        if status == ExperimentStatus.RUNNING:
            trained += max(0.0, until - start_ts)
        else:
            run = max(0.0, min(finished_at or until, until) - start_ts)
            trained += min(training, run) if training is not None else run
    slots = len(ledger.workers())
    held = slots * max(0.0, until - since)
    return FleetEfficiency(trained / held if held > 0 else None, trained, held, slots, since, until)
