"""Per-tier figures, the noise floor and verdicts, computed from the ledger.

The incumbent is the lab's HEAD; its figure on a tier is the mean of every ok run of
HEAD's exact files on that tier. A candidate is judged only against the incumbent on the
same tier (the same code scores differently on different hardware under a wall-clock
budget), with the rule in `nightlab.search.decide`. Verdicts are stored on the
experiments so that the CLI, reports and dashboard all show the same ones.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nightlab import identity, snapshots
from nightlab.config import LabConfig
from nightlab.ledger import Experiment, ExperimentStatus, Ledger
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
    groups: dict[str, list[float]] = {}
    for e in ledger.experiments(status=ExperimentStatus.FINISHED, tier=tier):
        v = e.metric(metric)
        if e.ok and v is not None and (epoch is None or e.epoch == epoch):
            groups.setdefault(e.tree, []).append(v)
    return pooled_sd(groups.values())


def baseline_figures(
    config: LabConfig, experiments: list[Experiment], tiers: list[str]
) -> dict[str, Figure | None]:
    """The baseline's figure per tier: the ok runs of the first snapshot there with verdict `baseline`."""
    metric = config.metric.name
    out: dict[str, Figure | None] = {}
    for t in tiers:
        mine = [e for e in experiments if e.tier == t]
        first = min((e for e in mine if e.verdict == "baseline"), key=lambda e: e.seq, default=None)
        out[t] = (
            None if first is None else figure(ok_values([e for e in mine if e.tree == first.tree], metric))
        )
    return out


def incumbent_figure(ledger: Ledger, config: LabConfig, lab_dir: Path, tier: str) -> Figure | None:
    tree = identity.of(lab_dir, "HEAD")
    return figure(ok_values(ledger.experiments(tree=tree, tier=tier), config.metric.name))


def decide_tree(
    ledger: Ledger,
    config: LabConfig,
    lab_dir: Path,
    tree: str,
    tier: str,
    *,
    extra: float | None = None,
    z: float | None = None,
):
    """The `Decision` for the snapshot `tree` on `tier` against the incumbent, or None if undecidable.

    `extra` is a result of `tree` that is not in the ledger yet (the run being recorded);
    `z` overrides `[search] z` (a wave's members use the z corrected for the wave's size).
    """
    from nightlab.search.decide import verdict

    metric = config.metric.name
    incumbent = ok_values(ledger.experiments(tree=identity.of(lab_dir, "HEAD"), tier=tier), metric)
    candidate = ok_values(ledger.experiments(tree=tree, tier=tier), metric)
    if extra is not None:
        candidate.append(extra)
    if not incumbent or not candidate:
        return None
    sigma, _ = noise_sigma(ledger, metric, tier, epoch=identity.epoch_key(config))
    return verdict(
        candidate,
        incumbent,
        noise_sigma=sigma,
        z=config.search.z if z is None else z,
        lower_is_better=config.metric.lower_is_better,
    )


def wave_z(ledger: Ledger, config: LabConfig, head_tree: str, wave: str | None) -> float:
    """`[search] z`, raised for a wave's members by the Sidak correction for its candidate count.

    A wave of m candidates is m comparisons against one incumbent: at an uncorrected z = 2 the
    best of 8 null candidates is kept in 13 % of waves instead of 2.3 % (`search.decide`).
    """
    if wave is None:
        return config.search.z
    from nightlab.search.decide import adjusted_z

    trees = {e.tree for e in ledger.experiments(wave=wave, with_metrics=False)} - {head_tree}
    return adjusted_z(config.search.z, len(trees))


def settle_hint(exp: Experiment, decision) -> str:
    """One line telling how to settle a within-noise result: which repeats to run."""
    repeats = getattr(decision, "repeats_to_settle", None)
    if repeats is None:
        return (
            f"{exp.id} is within noise and the gain is too small to settle with a few runs; "
            f"measure the noise floor with `nightlab noise --tier {exp.tier}` or treat it as no gain"
        )
    steps = [f'`nightlab submit --from {exp.id} --repeats {repeats.candidate} -m "repeat {exp.id}"`']
    if repeats.incumbent:
        steps.append(f"`nightlab noise --repeats {repeats.incumbent} --tier {exp.tier}`")
    return f"{exp.id} is within noise: settle it with " + " and ".join(steps)


def verdict_for(
    ledger: Ledger, config: LabConfig, lab_dir: Path, exp: Experiment, outcome: str, value: float | None
) -> str | None:
    """The verdict a run of `exp` that ended with `outcome` and metric `value` earns now.

    Computed before the run is recorded, so the verdict is stored in the same transaction
    as the outcome and nobody ever sees a finished run without one.
    """
    if outcome == "cancelled":
        return None
    if outcome == "degraded":
        return "degraded"  # starved or throttled: recorded, never judged (fleet/health.py)
    if outcome != "ok":
        return "invalid" if outcome == "invalid" else "crash"
    if exp.tree == identity.of(lab_dir, "HEAD"):
        # the incumbent's own runs: kept if it came from an adoption, else the starting point
        adopted = any(e.adopted_at is not None for e in ledger.experiments(tree=exp.tree, with_metrics=False))
        return "keep" if adopted else "baseline"
    head_tree = identity.of(lab_dir, "HEAD")
    z = wave_z(ledger, config, head_tree, exp.wave)
    decision = decide_tree(ledger, config, lab_dir, exp.tree, exp.tier, extra=value, z=z)
    return decision.verdict if decision is not None else None


def judged_context(ledger: Ledger, config: LabConfig, lab_dir: Path, tier: str) -> dict:
    """What a verdict given now is judged against: the incumbent (commit, identity) and its figure."""
    head = snapshots.head(lab_dir)
    head_tree = identity.of(lab_dir, head)  # a commit hash: no second git call
    f = figure(ok_values(ledger.experiments(tree=head_tree, tier=tier), config.metric.name))
    return {
        "incumbent": head,
        "tree": head_tree,
        "mean": f.mean if f else None,
        "n": f.n if f else 0,
    }


def refresh_siblings(
    ledger: Ledger, exp: Experiment, verdict: str | None, *, judged: dict | None = None
) -> None:
    """Give the snapshot's other ok runs on the tier the verdict their pooled figure earns now."""
    for other in ledger.experiments(tree=exp.tree, tier=exp.tier, with_metrics=False):
        if other.id != exp.id and other.ok and other.verdict != verdict:
            ledger.set_verdict(other.id, verdict, judged=judged)


def refresh_pending(ledger: Ledger, config: LabConfig, lab_dir: Path, tier: str) -> None:
    """Re-judge the incumbent's candidates on `tier` whose verdict was recorded before it could be.

    A run that ended before the incumbent had a figure on its tier has no verdict, and one judged
    before the tier had a noise floor is `within-noise` by default. The controller calls this when
    a run of the incumbent ends (its figure and the noise floor just moved): every snapshot derived
    from the incumbent (its parent is HEAD) with such a verdict gets the one its runs earn now.
    """
    head_tree = identity.of(lab_dir, "HEAD")
    seen: set[str] = set()
    candidates = ledger.experiments(
        status=ExperimentStatus.FINISHED, tier=tier, parent=snapshots.head(lab_dir), with_metrics=False
    )
    for e in candidates:
        if e.tree in seen or e.tree == head_tree or not e.ok or e.verdict not in (None, "within-noise"):
            continue
        seen.add(e.tree)
        new = verdict_for(ledger, config, lab_dir, e, "ok", None)
        if new is not None and new != e.verdict:
            judged = judged_context(ledger, config, lab_dir, tier)
            ledger.set_verdict(e.id, new, judged=judged)
            refresh_siblings(ledger, e, new, judged=judged)


@dataclass(frozen=True)
class ResultRow:
    """One experiment as `nightlab results` and the dashboard show it."""

    experiment: Experiment
    value: float | None
    delta: float | None  # value minus the incumbent's mean on the same tier (None when either is missing)
    # its verdict was judged against another incumbent than today's (`Experiment.judged` says which)
    earlier_incumbent: bool = False
    incumbent: bool = False  # a run of today's incumbent: its verdict is history, not a judgement of it

    def to_dict(self, metric: str) -> dict:
        e = self.experiment
        return {
            **e.brief(metric),
            "wave": e.wave,
            "snapshot": e.snapshot,
            "delta": self.delta,
            "judged": e.judged,
            "earlier_incumbent": self.earlier_incumbent,
            "incumbent": self.incumbent,
            "epoch": e.epoch,
            "health": e.health,
            "submitted_at": e.submitted_at,
            "finished_at": e.finished_at,
            "metrics": e.metrics,
        }


def results(
    ledger: Ledger, config: LabConfig, lab_dir: Path, *, tier: str | None = None
) -> tuple[list[ResultRow], dict[str, Figure | None]]:
    """All experiments (optionally of one tier), ok runs best first, then the rest by recency.

    Returns the rows and the incumbent's figure per tier.
    """
    metric = config.metric.name
    exps = ledger.experiments(tier=tier)
    head_tree = identity.of(lab_dir, "HEAD")
    tiers = sorted({e.tier for e in exps} | ({tier} if tier else set()))
    incumbents = {
        t: figure(ok_values([e for e in exps if e.tree == head_tree and e.tier == t], metric)) for t in tiers
    }
    rows = []
    current = identity.epoch_key(config)
    for e in exps:
        value = e.metric(metric) if e.ok else None
        inc = incumbents.get(e.tier)
        # a run of another comparison epoch was measured differently: no delta against today's incumbent
        comparable = value is not None and inc is not None and e.epoch == current
        earlier = bool(e.judged) and e.judged.get("tree") != head_tree and e.tree != head_tree
        rows.append(
            ResultRow(
                e, value, value - inc.mean if comparable else None, earlier, e.ok and e.tree == head_tree
            )
        )
    sign = 1 if config.metric.lower_is_better else -1
    ok = sorted((r for r in rows if r.value is not None), key=lambda r: (sign * r.value, r.experiment.seq))
    rest = sorted((r for r in rows if r.value is None), key=lambda r: -r.experiment.seq)
    return ok + rest, incumbents


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
    record = ledger.controller()
    if record is not None:
        since, until = record.started_at, max(record.heartbeat_at, record.started_at)
    else:
        start = ledger._query(
            "SELECT id, ts FROM events WHERE kind = 'controller-start' ORDER BY id DESC LIMIT 1"
        )
        if not start:
            return None
        stop = ledger._query(
            "SELECT ts FROM events WHERE kind = 'controller-stop' AND id > ? ORDER BY id LIMIT 1",
            (start[0]["id"],),
        )
        since = start[0]["ts"]
        until = stop[0]["ts"] if stop else since
    rows = ledger._query(
        "SELECT e.status, e.started_at, e.finished_at, m.value AS training FROM experiments e"
        " LEFT JOIN metrics m ON m.experiment_id = e.id AND m.key = 'training_seconds'"
        " WHERE (e.status = ? AND e.outcome = 'ok' AND e.finished_at >= ?) OR e.status = ?",
        (int(ExperimentStatus.FINISHED), since, int(ExperimentStatus.RUNNING)),
    )
    trained = 0.0
    for r in rows:
        start_ts = max(r["started_at"] or since, since)
        if r["status"] == ExperimentStatus.RUNNING:
            trained += max(0.0, until - start_ts)
        else:
            run = max(0.0, min(r["finished_at"], until) - start_ts)
            trained += min(r["training"], run) if r["training"] is not None else run
    slots = len(ledger.workers())
    held = slots * max(0.0, until - since)
    return FleetEfficiency(trained / held if held > 0 else None, trained, held, slots, since, until)
