"""The `nightlab status --json` document: controller, workers, running runs and queue.

`nightlab fleet status` and the dashboard's fleet panel serve the same one.
"""

from __future__ import annotations

import time
from typing import Any

EXPECTED_FROM_RUNS = 10  # recent ok runs of a tier whose median wall time predicts a run's end


def expected_seconds(lab: Any, tier: str) -> float | None:
    """How long a run of `tier` is expected to take, start to end: the median wall time of the
    tier's last ok runs, else its training budget (a screening rung's own, else the profile's;
    start-up and eval come on top), else None (a foreign target before its first run)."""
    from statistics import median

    from nightlab.rungs import budget_of

    ok = lab.ledger.recent_wall_seconds(tier, EXPECTED_FROM_RUNS)
    if ok:
        return median(ok)
    return budget_of(lab.config, tier)


def controller_state(lab: Any) -> dict[str, Any]:
    """Whether the lab's controller runs or is starting, its pid, and its heartbeat's age.

    While one starts (its process exists but does not hold the lock yet) `starting` is true and
    `pid` is null: the ledger's record still names the previous controller then. A stopped
    controller's `pid` is the last one's, from that record.
    """
    from nightlab.fleet.daemon import running_pid

    pid = running_pid(lab.path)
    record = lab.ledger.controller()
    starting = pid == -1
    return {
        "running": pid is not None,
        "starting": starting,
        "pid": None if starting else pid if pid is not None else (record.pid if record else None),
        "heartbeat_age": time.time() - record.heartbeat_at if record else None,
    }


def fleet_state(lab: Any) -> dict[str, Any]:
    """The controller, workers, running experiments and queue, as plain data."""
    from nightlab.analysis import fleet_efficiency
    from nightlab.fleet.costs import worker_costs
    from nightlab.ledger import ExperimentStatus
    from nightlab.trackers import tracker_status

    running = lab.ledger.experiments(status=ExperimentStatus.RUNNING, with_metrics=False)
    queued = lab.ledger.experiments(status=ExperimentStatus.QUEUED, with_metrics=False)
    timeout = lab.config.target.timeout
    now = time.time()
    efficiency = fleet_efficiency(lab.ledger)
    run_rows = []
    expected = {t: expected_seconds(lab, t) for t in {e.tier for e in running}}
    for e in running:
        attempts = lab.ledger.attempts(e.id)
        current = attempts[-1] if attempts else None
        started = current.started_at if current else e.started_at
        run_rows.append(
            {
                "id": e.id,
                "worker": current.worker if current else None,
                "tier": e.tier,
                "attempt": e.attempts,
                "elapsed": now - started if started else None,
                # to the expected end (the budget as the tier's runs spend it); the hard limit
                # (`target.timeout`, when the run is killed) is a separate figure
                "remaining": expected[e.tier] - (now - started) if started and expected[e.tier] else None,
                "expected": expected[e.tier],
                "timeout": timeout,
                "description": e.description,
            }
        )
    return {
        "controller": controller_state(lab),
        "workers": [w.to_dict() for w in lab.ledger.workers()],
        "efficiency": efficiency.__dict__ if efficiency else None,
        "clusters": [w.to_dict() for w in worker_costs(lab.ledger)],
        "running": run_rows,
        "queued": [
            {"id": e.id, "tier": e.tier, "priority": e.priority, "description": e.description} for e in queued
        ],
        # each configured experiment tracker: runs sent, runs queued, its outage (docs/trackers.md)
        "trackers": tracker_status(lab.config, lab.ledger),
        # each tier's training budget and the rung it promotes to (`nightlab.rungs`), when any screens
        "rungs": rung_rows(lab.config),
    }


def rung_rows(config: Any) -> list[dict[str, Any]]:
    """Each tier's budget and next rung, when the lab has screening rungs (else empty)."""
    from nightlab.rungs import budget_of, has_rungs, next_rung

    if not has_rungs(config):
        return []
    return [
        {"tier": t, "budget_seconds": budget_of(config, t), "promote_to": next_rung(config, t)}
        for t in config.fleet.tiers
    ]
