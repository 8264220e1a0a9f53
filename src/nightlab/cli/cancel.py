from __future__ import annotations

import click

from nightlab.cli._common import emit_json, json_option, with_lab


@click.command("cancel")
@click.argument("ids", nargs=-1, required=True)
@json_option
@with_lab
def command(lab, ids, as_json) -> None:
    """Cancel experiments: queued ones at once, running ones are killed by the controller."""
    from nightlab.ledger import ExperimentStatus

    for i in ids:
        lab.ledger.get(i)  # every id must exist before anything is cancelled
    out = {}
    for i in ids:
        status = lab.ledger.request_cancel(i)
        out[i] = {
            ExperimentStatus.CANCELLED: "cancelled",
            ExperimentStatus.RUNNING: "cancelling",
        }.get(status, f"already {status.label}")
    if as_json:
        emit_json(out)
        return
    for i, state in out.items():
        click.echo(f"{i}  {state}")
