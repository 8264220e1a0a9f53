from __future__ import annotations

import time

import click

from nightlab.cli._common import console, duration, emit_json, json_option, say, with_lab

EXPECTED_FROM_RUNS = 10  # recent ok runs of a tier whose median wall time predicts a run's end


def expected_seconds(lab, tier: str) -> float | None:
    """How long a run of `tier` is expected to take, start to end: the median wall time of the
    tier's last ok runs, else the profile's training budget (start-up and eval come on top), else
    None (a foreign target before its first run)."""
    from statistics import median

    ok = [
        e.finished_at - e.started_at
        for e in lab.ledger.experiments(tier=tier, with_metrics=False)
        if e.ok and e.started_at and e.finished_at
    ][-EXPECTED_FROM_RUNS:]
    if ok:
        return median(ok)
    if lab.config.profile:
        from nightlab.harness.profiles import Profile

        return Profile.from_dict(lab.config.profile).budget_seconds
    return None


def fleet_state(lab) -> dict:
    """The controller, workers, running experiments and queue, as plain data."""
    from nightlab.analysis import fleet_efficiency
    from nightlab.fleet.costs import worker_costs
    from nightlab.fleet.daemon import running_pid
    from nightlab.ledger import ExperimentStatus

    pid = running_pid(lab.path)
    record = lab.ledger.controller()
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
        "controller": {
            "running": pid is not None,
            "pid": pid if pid and pid > 0 else (record.pid if record else None),
            "heartbeat_age": now - record.heartbeat_at if record else None,
        },
        "workers": [w.to_dict() for w in lab.ledger.workers()],
        "efficiency": efficiency.__dict__ if efficiency else None,
        "clusters": [w.to_dict() for w in worker_costs(lab.ledger)],
        "running": run_rows,
        "queued": [
            {"id": e.id, "tier": e.tier, "priority": e.priority, "description": e.description} for e in queued
        ],
    }


def print_state(state: dict) -> None:
    out = console()
    c = state["controller"]
    if c["running"]:
        out.print(f"controller: running (pid {c['pid']})")
    else:
        out.print("controller: not running (starts with the next submit, or `nightlab fleet start`)")
    for w in state["workers"]:
        out.print(f"  {w['name']:<14} {w['tier']:<8} {w['state']:<8} {w['experiment_id'] or ''}")
    if state.get("clusters"):
        current = {w["name"]: w["experiment_id"] for w in state["workers"]}
        out.print("clusters (SkyPilot):")
        for k in state["clusters"]:
            price = "-" if k["hourly_price"] is None else f"${k['hourly_price']:.2f}/h"
            cost = "-" if k["cost"] is None else f"${k['cost']:.2f}"
            software = (
                f"nightlab {k['nightlab_version']} ({k['nightlab_code']}), torch {k['torch_version'] or '-'}"
                if k.get("nightlab_version")
                else "nightlab -"
            )
            out.print(
                f"  {k['worker']:<14} {k['cluster'] or '-':<24} {k['state']:<9} "
                f"{current.get(k['worker']) or '-':<6} {price:>9}  {cost} so far  {software}"
            )
    out.print(f"running: {len(state['running'])}")
    for r in state["running"]:
        if r["remaining"] is None:
            left = "end unknown"
        elif r["remaining"] >= 0:
            left = f"~{duration(r['remaining'])} left"
        else:
            left = f"{duration(-r['remaining'])} over the expected {duration(r['expected'])}"
        limit = duration(r["timeout"] - r["elapsed"]) if r["elapsed"] is not None else "-"
        out.print(
            f"  {r['id']}  {r['worker'] or '-':<14} elapsed {duration(r['elapsed'])}, {left} "
            f"(hard limit in {limit})  {r['description'][:50]}"
        )
    out.print(f"queued: {len(state['queued'])}")
    for q in state["queued"][:10]:
        out.print(f"  {q['id']}  {q['tier']:<8} p{q['priority']}  {q['description'][:50]}")
    if len(state["queued"]) > 10:
        out.print(f"  ... and {len(state['queued']) - 10} more")


@click.command("status")
@json_option
@with_lab
def command(lab, as_json) -> None:
    """Workers, running experiments (elapsed, time left to the expected end, the hard limit) and the queue.

    The expected end is the median wall time of the tier's last ok runs (before the first one,
    the profile's training budget); the hard limit is `target.timeout`, when a run is killed.

    \b
    Example:
      nightlab status --json | jq '.queued | length'
    """
    from nightlab.fleet.daemon import revive

    restarted = revive(lab.path, lab.ledger)
    if restarted:
        say(
            f"the controller had died; restarted it (pid {restarted}): runs in flight are re-attached or requeued"
        )
    state = fleet_state(lab)
    if as_json:
        emit_json(state)
        return
    print_state(state)
