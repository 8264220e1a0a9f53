"""Per-tier figures and the noise floor, computed from the ledger, and the rows `nightlab results` lists.

The incumbent is the lab's HEAD (`identity.incumbent`); its figure on a tier is the mean of every
ok run of HEAD's research identity on that tier. Verdicts are decided and written by
`nightlab.judge` alone, with the figures from here; they are stored on the experiments so that
the CLI, reports and dashboard all show the same ones.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nightlab import identity
from nightlab.config import LabConfig
from nightlab.ledger import Experiment, ExperimentStatus, Ledger, Verdict
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
        first = min((e for e in mine if e.verdict == Verdict.BASELINE), key=lambda e: e.seq, default=None)
        out[t] = (
            None if first is None else figure(ok_values([e for e in mine if e.tree == first.tree], metric))
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
    head_tree = identity.incumbent(lab_dir).tree
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
