from __future__ import annotations

import click

from nightlab.cli._common import emit_json, json_option, say, with_lab


@click.command("wait")
@click.argument("ids", nargs=-1)
@click.option(
    "--all", "all_", is_flag=True, help="Whether or not to wait for every queued and running experiment."
)
@click.option("--any", "any_", is_flag=True, help="Whether or not to return as soon as one of them ends.")
@click.option(
    "--timeout",
    type=float,
    default=None,
    help="Give up after this many seconds (exit 1; with --json the state of each is printed first).",
)
@json_option
@with_lab
def command(lab, ids, all_, any_, timeout, as_json) -> None:
    """Block until experiments end; prints each one's outcome and metric.

    Without `--any` it also waits for the re-run the fleet queues for each run that ends
    `degraded`, and lists it after them.

    \b
    Example:
      nightlab wait --any --json | jq -r '.[].id'
    """
    from nightlab.errors import UsageError, WaitTimeoutError

    if ids and all_:
        raise UsageError("give experiment ids or `--all`, not both")
    if not ids and not all_ and not any_:
        raise UsageError("say what to wait for: experiment ids, `--all` or `--any`")
    from nightlab.fleet.daemon import revive

    revive(lab.path, lab.ledger)  # a killed controller would leave this waiting forever
    metric = lab.config.metric.name

    def rows(exps) -> list[dict]:
        return [
            {
                "id": e.id,
                "status": e.status.label,
                "outcome": e.outcome,
                "verdict": e.verdict,
                metric: e.metric(metric),
            }
            for e in exps
        ]

    try:
        # a degraded run says nothing: waiting for all waits for the re-runs of those that end so
        done = lab.wait(list(ids) or None, mode="any" if any_ else "all", timeout=timeout, reruns=True)
    except WaitTimeoutError as e:
        if as_json:  # a script learns what is still queued or running, then the exit code says timeout
            emit_json(rows(e.experiments))
        raise
    except KeyboardInterrupt:
        say(interrupted_message(lab, ids, any_=any_))
        raise click.exceptions.Exit(130) from None
    if as_json:
        emit_json(rows(done))
        return
    for e in done:
        value = e.metric(metric)
        click.echo(
            f"{e.id}  {e.outcome or e.status.label:<16} {metric}={'-' if value is None else f'{value:.6f}'}"
            f"  {e.verdict or ''}"
        )
    if not done:
        say("nothing to wait for")


def interrupted_message(lab, ids: tuple[str, ...], *, any_: bool) -> str:
    """What Ctrl-C leaves behind: the runs go on on the fleet, and the command that waits again."""
    from nightlab.ledger import ExperimentStatus

    active = (ExperimentStatus.QUEUED, ExperimentStatus.RUNNING)
    if ids:
        pending = [e for e in lab.ledger.experiments(ids=list(ids), with_metrics=False) if e.status in active]
    else:
        pending = lab.ledger.experiments(status=active, with_metrics=False)
    if not pending:
        return "wait interrupted; nothing is queued or running"
    left = ", ".join(f"{e.id} ({e.status.label})" for e in pending[:8])
    left += f" and {len(pending) - 8} more" if len(pending) > 8 else ""
    what = [e.id for e in pending] if ids else ([] if any_ else ["--all"])
    again = " ".join(["nightlab wait", *(["--any"] if any_ else []), *what])
    return f"wait interrupted; still going on the fleet: {left}; wait again with `{again}`"
