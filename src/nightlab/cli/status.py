from __future__ import annotations

import click

from nightlab.cli._common import console, duration, emit_json, json_option, say, with_lab
from nightlab.display import clock
from nightlab.views import fleet_state


def print_state(state: dict) -> None:
    out = console()
    c = state["controller"]
    if c["starting"]:
        out.print("controller: starting")
    elif c["running"]:
        out.print(f"controller: running (pid {c['pid']})")
    else:
        out.print("controller: not running (starts with the next submit, or `nightlab fleet start`)")
    for w in state["workers"]:
        out.print(f"  {w['name']:<14} {w['tier']:<8} {w['state']:<8} {w['experiment_id'] or ''}")
    if state.get("rungs"):
        rungs = [
            f"{r['tier']} {r['budget_seconds']:g} s" + (f" -> {r['promote_to']}" if r["promote_to"] else "")
            if r["budget_seconds"] is not None
            else r["tier"] + (f" -> {r['promote_to']}" if r["promote_to"] else "")
            for r in state["rungs"]
        ]
        out.print("rungs: " + ", ".join(rungs))
    if state.get("clusters"):
        from nightlab.fleet.costs import cluster_of

        out.print("clusters (SkyPilot):")
        for k in state["clusters"]:
            # a cluster of N slots (an 8-GPU node) runs N experiments: `3/8 busy`
            running = [
                w["experiment_id"]
                for w in state["workers"]
                if w["experiment_id"] and cluster_of(w["name"], {k["worker"]})
            ]
            slots = k.get("slots") or 1
            busy = (running[0] if running else "-") if slots == 1 else f"{len(running)}/{slots} busy"
            price = "-" if k["hourly_price"] is None else f"${k['hourly_price']:.2f}/h"
            if slots > 1 and k["hourly_price"] is not None:
                price += f" (${k['hourly_price'] / slots:.2f}/h a slot)"
            cost = "-" if k["cost"] is None else f"${k['cost']:.2f}"
            software = (
                f"nightlab {k['nightlab_version']} ({k['nightlab_code']}), torch {k['torch_version'] or '-'}"
                if k.get("nightlab_version")
                else "nightlab -"
            )
            out.print(
                f"  {k['worker']:<14} {k['cluster'] or '-':<24} {k['state']:<9} "
                f"{busy:<6} {price:>9}  {cost} so far  {software}"
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
    for t in state.get("trackers", []):
        line = f"tracker {t['tracker']}: {t['sent']} run(s) sent, {t['queued']} queued ({t['destination']})"
        if not t["installed"]:
            line += f"; {t['tracker']} is not installed: pip install 'nightlab[{t['tracker']}]'"
        elif t["error"]:
            line += (
                f"; failing since {clock(t['failing_since'])}: {t['error']}; "
                f"the queued runs are sent when it works (`nightlab doctor`)"
            )
        out.print(line)


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
