"""What the remote fleet costs and how much of it trains: per worker and per experiment.

Everything comes from the ledger. The SkyPilot backend records one event per cluster
change (`cluster-launch`, `cluster-up` with its hourly price and set-up seconds,
`cluster-failed`, `cluster-lost`, `cluster-down`); attempts carry their worker and their
start and end. From those:

    held      seconds a cluster was billing: from each launch to its down / loss, or to now
    setup     seconds from a launch to the cluster being up (provisioning + set-up script)
    busy      seconds attempts ran on the worker (lease to end, so dispatch overhead counts;
              a next attempt queued while one runs counts once)
    training  the `training_seconds` each finished experiment reported on that worker
    idle      held - setup - busy
    efficiency  training / held  (the public autoresearch 16-GPU run: ~7 of 12 possible
                5-minute runs per GPU-hour, i.e. about 0.58)

A cluster of N slots (an 8-GPU node runs 8 experiments, `slots_per_cluster`) is one worker
here, with its slots' attempts (`<worker>-g<j>`) under it: its held, set-up and idle time count
N slot-seconds per second (`slot_seconds`), its busy time is the sum over its lanes, and an
experiment costs its time at the node's price divided by N.

A cluster that stopped itself (autostop) while no controller watched has no `down` event;
it is counted as held until its last activity plus its autostop minutes, which is when
SkyPilot stops it. Prices are SkyPilot's catalog price of the launched instance, or the
pool's `hourly_price` (Kubernetes and Slurm have no catalog price).

stdlib only; `nightlab report` and `nightlab fleet status` read it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from nightlab.fleet.cluster_states import CLUSTER_EVENTS, BillingState, ClusterEvent
from nightlab.ledger import ExperimentStatus, Ledger


def hourly_price(handle: Any, override: float | None = None) -> float | None:
    """Dollars per hour of a launched cluster: the pool's `hourly_price`, else SkyPilot's price.

    Args:
        handle: the resource handle `sky.launch` returned (its `launched_resources` and
            `launched_nodes`).
        override: the pool's `hourly_price`, which wins when set.

    Returns:
        The price, or None when SkyPilot has none for these resources.
    """
    if override is not None:
        return float(override)
    try:
        resources = handle.launched_resources
        nodes = getattr(handle, "launched_nodes", 1) or 1
        return float(resources.get_cost(3600)) * nodes
    except Exception:  # no cloud / instance type / catalog entry: the price is unknown
        return None


@dataclass
class WorkerCost:
    """Time and money of one remote worker over a window."""

    worker: str
    cluster: str | None
    state: BillingState
    hourly_price: float | None
    gpu_name: str | None
    nightlab_version: str | None = None  # what the cluster's set-up installed (probe after set-up)
    nightlab_code: str | None = None
    torch_version: str | None = None
    slots: int = 1  # experiments the cluster runs at once (its lanes)
    held_seconds: float = 0.0
    setup_seconds: float = 0.0
    busy_seconds: float = 0.0
    training_seconds: float = 0.0
    experiments: int = 0

    @property
    def slot_seconds(self) -> float:
        """Held seconds times the cluster's slots: what its experiments could have used."""
        return self.held_seconds * self.slots

    @property
    def idle_seconds(self) -> float:
        """Slot-seconds held but neither setting up nor running an attempt."""
        return max(0.0, self.slot_seconds - self.setup_seconds * self.slots - self.busy_seconds)

    @property
    def cost(self) -> float | None:
        return None if self.hourly_price is None else self.held_seconds * self.hourly_price / 3600

    @property
    def slot_price(self) -> float | None:
        """$/h of one slot: the node's price divided by its slots."""
        return None if self.hourly_price is None else self.hourly_price / self.slots

    @property
    def efficiency(self) -> float | None:
        return self.training_seconds / self.slot_seconds if self.slot_seconds > 0 else None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            idle_seconds=self.idle_seconds,
            cost=self.cost,
            efficiency=self.efficiency,
            slot_seconds=self.slot_seconds,
            slot_price=self.slot_price,
        )
        return out


def _clip(a: float, b: float, since: float | None, until: float) -> float:
    lo = a if since is None else max(a, since)
    return max(0.0, min(b, until) - lo)


def worker_costs(
    ledger: Ledger, *, since: float | None = None, until: float | None = None
) -> list[WorkerCost]:
    """Per remote worker: held, setup, busy, training and idle seconds and cost in [since, until].

    Args:
        since: start of the window (e.g. the moment the last cluster came up); None = all.
        until: end of the window; None = now.
    """
    until = time.time() if until is None else until
    events = ledger.events(limit=1_000_000, kinds=CLUSTER_EVENTS)
    if not events:  # no remote workers ever: nothing to cost, and no reason to read the attempts
        return []
    workers: dict[str, WorkerCost] = {}
    open_since: dict[str, float] = {}
    launch_at: dict[str, float] = {}
    autostop: dict[str, float] = {}  # seconds after the last activity when a cluster stops itself
    activity: dict[str, float] = {}
    for e in events:
        w = workers.setdefault(
            e.worker or "?", WorkerCost(e.worker or "?", e.data.get("cluster"), BillingState.DOWN, None, None)
        )
        w.cluster = e.data.get("cluster", w.cluster)
        w.state = BillingState.after(ClusterEvent(e.kind))
        activity[w.worker] = e.ts  # autostop counts idle time from the last thing that happened
        if e.kind == ClusterEvent.LAUNCH:
            open_since.setdefault(w.worker, e.ts)
            launch_at[w.worker] = e.ts
        elif e.kind == ClusterEvent.UP:
            w.hourly_price = e.data.get("hourly_price", w.hourly_price)
            w.gpu_name = e.data.get("gpu_name") or w.gpu_name
            w.nightlab_version = e.data.get("nightlab_version") or w.nightlab_version
            w.nightlab_code = e.data.get("nightlab_code") or w.nightlab_code
            w.torch_version = e.data.get("torch_version") or w.torch_version
            w.slots = max(1, int(e.data.get("slots") or 1))
            minutes = e.data.get("autostop_minutes", 10)
            # None: the cluster never stops itself (a Slurm allocation lasts until its time limit)
            autostop[w.worker] = float("inf") if minutes is None else 60.0 * float(minutes)
            start = launch_at.pop(w.worker, e.ts - float(e.data.get("setup_seconds", 0.0)))
            w.setup_seconds += _clip(start, e.ts, since, until)
        elif e.kind == ClusterEvent.FAILED and e.data.get("provisioned"):
            launch_at.pop(w.worker, None)  # set-up failed on a live cluster: it bills until autostop
        elif e.kind in (ClusterEvent.LOST, ClusterEvent.DOWN, ClusterEvent.FAILED) and w.worker in open_since:
            w.held_seconds += _clip(open_since.pop(w.worker), e.ts, since, until)
            launch_at.pop(w.worker, None)
    attempts = _attempts_by_worker(ledger, set(workers))
    for name, start in open_since.items():
        own = [a for lane, spans in attempts.items() if cluster_of(lane, set(workers)) == name for a in spans]
        last = max([start, activity[name]] + [a[1] or until for a in own])
        end = until if ledger.controller() is not None else min(until, last + autostop.get(name, 600.0))
        workers[name].held_seconds += _clip(start, end, since, until)
        if end < until and workers[name].state == BillingState.UP:
            workers[
                name
            ].state = BillingState.AUTOSTOPPED  # no controller watched: SkyPilot stopped it by now
    training = _training_by_worker(ledger)
    lanes: dict[str, set[str]] = {name: {name} for name in workers}
    for slot in {*attempts, *training}:
        cluster = cluster_of(slot, set(workers))
        if cluster is not None:
            lanes[cluster].add(slot)
    for name, w in workers.items():
        for lane in lanes[name]:  # each lane of a cluster is busy on its own
            for started, ended in _union([(a, b or until) for a, b in attempts.get(lane, [])]):
                w.busy_seconds += _clip(started, ended, since, until)
        for finished_at, seconds in (item for lane in lanes[name] for item in training.get(lane, [])):
            if since is None or finished_at >= since:
                w.training_seconds += seconds
                w.experiments += 1
    return sorted(workers.values(), key=lambda w: w.worker)


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The spans merged where they overlap: a pipelined worker's next attempt is leased while one runs."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def cluster_of(worker: str, clusters: set[str]) -> str | None:
    """The cluster worker a slot belongs to: itself, or `h100-aws-0` for its lane `h100-aws-0-g3`."""
    if worker in clusters:
        return worker
    head, sep, lane = worker.rpartition("-g")
    return head if sep and lane.isdigit() and head in clusters else None


def _attempts_by_worker(ledger: Ledger, names: set[str]) -> dict[str, list[tuple[float, float | None]]]:
    """Attempt spans per slot of the clusters `names` (a one-slot cluster's slot is the cluster)."""
    out: dict[str, list[tuple[float, float | None]]] = {}
    for e in ledger.experiments(with_metrics=False):
        for a in ledger.attempts(e.id):
            if a.worker and cluster_of(a.worker, names) is not None:
                out.setdefault(a.worker, []).append((a.started_at, a.ended_at))
    return out


def _training_by_worker(ledger: Ledger) -> dict[str, list[tuple[float, float]]]:
    """(finished_at, training_seconds) of each ok experiment, under its last attempt's worker.

    Crashes and timeouts count nothing: that GPU time was held but wasted.
    """
    out: dict[str, list[tuple[float, float]]] = {}
    for e in ledger.experiments(status=ExperimentStatus.FINISHED):
        seconds = e.metric("training_seconds") if e.outcome == "ok" else None
        attempts = ledger.attempts(e.id)
        if seconds is None or not attempts or e.finished_at is None:
            continue
        out.setdefault(attempts[-1].worker, []).append((e.finished_at, float(seconds)))
    return out


def attempt_costs(ledger: Ledger) -> dict[str, float]:
    """Dollars per experiment: each attempt's duration times its slot's hourly price (node price / slots)."""
    prices: dict[str, float] = {}
    for e in ledger.events(limit=1_000_000, kinds=(ClusterEvent.UP,)):
        if e.worker and e.data.get("hourly_price") is not None:
            prices[e.worker] = float(e.data["hourly_price"]) / max(1, int(e.data.get("slots") or 1))
    out: dict[str, float] = {}
    if not prices:
        return out
    now = time.time()
    names = set(prices)
    for e in ledger.experiments(with_metrics=False):
        for a in ledger.attempts(e.id):
            cluster = cluster_of(a.worker, names) if a.worker else None
            if cluster is not None:
                seconds = (a.ended_at or now) - a.started_at
                out[e.id] = out.get(e.id, 0.0) + seconds * prices[cluster] / 3600
    return out


def cost_summary(ledger: Ledger) -> dict[str, Any] | None:
    """Fleet totals for reports: cost, efficiency, cost per experiment and per kept improvement.

    Returns:
        None when the lab never ran a remote cluster.
    """
    workers = worker_costs(ledger)
    if not workers:
        return None
    priced = [w for w in workers if w.cost is not None]
    total = sum(w.cost for w in priced) if priced else None
    held = sum(w.slot_seconds for w in workers)
    training = sum(w.training_seconds for w in workers)
    finished = ledger.experiments(status=ExperimentStatus.FINISHED, with_metrics=False)
    kept = [e for e in finished if e.verdict == "keep"]
    per_exp = attempt_costs(ledger)
    return {
        "workers": [w.to_dict() for w in workers],
        "total_cost": total,
        "held_gpu_hours": held / 3600,
        "training_hours": training / 3600,
        "setup_hours": sum(w.setup_seconds for w in workers) / 3600,
        "idle_hours": sum(w.idle_seconds for w in workers) / 3600,
        "efficiency": training / held if held > 0 else None,
        "experiments": len(finished),
        "kept": len(kept),
        "cost_per_experiment": total / len(finished) if total is not None and finished else None,
        "cost_per_kept": total / len(kept) if total is not None and kept else None,
        "experiment_costs": per_exp,
    }


def cost_markdown(summary: dict[str, Any]) -> str:
    """The fleet section of a report, as Markdown."""

    def money(v: float | None) -> str:
        return "-" if v is None else f"${v:,.2f}"

    def hours(v: float) -> str:
        return f"{v:.2f} h"

    eff = summary["efficiency"]
    lines = [
        "# Fleet cost and time",
        "",
        f"- total cost: {money(summary['total_cost'])} for {hours(summary['held_gpu_hours'])} of held GPUs",
        f"- training {hours(summary['training_hours'])}, setup {hours(summary['setup_hours'])}, "
        f"idle {hours(summary['idle_hours'])}; fleet efficiency "
        f"{'-' if eff is None else f'{eff:.2f}'} (training seconds / held GPU seconds)",
        f"- {summary['experiments']} experiments, {money(summary['cost_per_experiment'])} each; "
        f"{summary['kept']} kept improvements, {money(summary['cost_per_kept'])} each",
        "",
        "| worker | cluster | gpu | state | $/h | held | setup | training | idle | efficiency | cost |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for w in summary["workers"]:
        price = w["hourly_price"]
        e = w["efficiency"]
        lines.append(
            f"| {w['worker']} | {w['cluster'] or '-'} | {w['gpu_name'] or '-'} | {w['state']} | "
            f"{'-' if price is None else f'{price:.2f}'} | {w['held_seconds'] / 3600:.2f} h | "
            f"{w['setup_seconds'] / 3600:.2f} h | {w['training_seconds'] / 3600:.2f} h | "
            f"{w['idle_seconds'] / 3600:.2f} h | {'-' if e is None else f'{e:.2f}'} | {money(w['cost'])} |"
        )
    return "\n".join(lines) + "\n"
