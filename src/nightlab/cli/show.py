from __future__ import annotations

import click

from nightlab.cli._common import console, emit_json, json_option, with_lab
from nightlab.views import TAIL_LINES, show_payload


@click.command("show")
@click.argument("experiment_id")
@click.option(
    "--tail", "tail_lines", type=int, default=TAIL_LINES, show_default=True, help="Log lines to show."
)
@click.option("--no-diff", is_flag=True, help="Whether or not to leave out the diff against the parent.")
@json_option
@with_lab
def command(lab, experiment_id, tail_lines, no_diff, as_json) -> None:
    """One experiment: outcome (with the exception line), metrics, diff against its parent, log tail.

    \b
    Example:
      nightlab show e0002 --json | jq .metrics
    """
    data = show_payload(lab, experiment_id, tail_lines=tail_lines, diff=not no_diff)
    if as_json:
        emit_json(data)
        return
    e = lab.ledger.get(experiment_id)
    diff, tail, log_path = data["diff"], data["log_tail"], data["log_path"]
    out = console()
    out.print(f"{e.id}  {e.description}")
    out.print(f"  status {e.status.label}, outcome {e.outcome or '-'}, verdict {e.verdict or '-'}")
    if e.detail:
        out.print(f"  detail {e.detail}")
    if data["reason"] and data["reason"] != e.detail:
        out.print(f"  why {data['reason']}")
    if data["next_step"]:
        out.print(f"  next {data['next_step']}")
    if e.finished_at is not None:
        from nightlab.harness.owned import TRUST_NOTES

        out.print(f"  trust {data['trust']}: {TRUST_NOTES[data['trust']]}")
    if e.health:
        from nightlab.fleet.health import Health

        out.print(f"  health {Health.from_dict(e.health).summary()}")
    if data["rerun"]:
        again = lab.ledger.get(data["rerun"])
        result = again.outcome or again.status.label
        out.print(f"  re-run as {again.id} ({result}): `nightlab show {again.id}`")
    if data["rerun_of"]:
        out.print(f"  re-run of {data['rerun_of']}, which ended degraded")
    rung = data["rung"]
    out.print(
        f"  tier {rung['label']}, seed {e.seed}, wave {e.wave or '-'}, attempts {e.attempts}, "
        f"snapshot {e.snapshot[:12]}"
    )
    if rung["why"]:
        reached = f"reached {rung['reached']}; " if rung["reached"] != e.tier else ""
        out.print(f"  rung {reached}{rung['why']}")
    if e.params:
        out.print("  set " + " ".join(f"{k}={v}" for k, v in e.params.items()))
    from nightlab.display import metric_note, number

    metric = lab.config.metric.name
    for key, value in e.metrics.items():
        note = metric_note(key, e.metrics)
        out.print(f"  {key}: {number(value, metric=key == metric)}" + (f" ({note})" if note else ""))
    if diff:
        out.print("diff against parent:")
        click.echo(diff.rstrip())
    if data["log_missing"]:
        out.print(f"log: missing (expected at {log_path}; it was deleted, or its run folder was)")
    elif tail:
        out.print(f"log tail ({log_path}):")
        click.echo("\n".join(tail))
