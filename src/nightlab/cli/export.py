from __future__ import annotations

import click

from nightlab.cli._common import emit_json, json_option, say, with_lab


@click.command("export")
@click.argument("tracker", type=click.Choice(["wandb", "mlflow"]))
@click.option(
    "--since",
    default=None,
    metavar="ID|DATE",
    help="Only experiments from this id on (`e0042`), or finished since this date (`2026-12-01T22:00`).",
)
@click.option("--wave", "wave_id", default=None, metavar="WAVE", help="Only the experiments of this wave.")
@json_option
@with_lab
def command(lab, tracker, since, wave_id, as_json) -> None:
    """Send the lab's finished experiments to Weights & Biases or MLflow (`[trackers]` in nightlab.toml).

    Idempotent: run ids derive from the lab and experiment ids, so a second export updates what
    changed (a verdict, an adoption) and never duplicates a run; live logging and an export agree.
    Exits 1 when the tracker fails (what was sent stays sent: export again).

    \b
    Example:
      nightlab export mlflow --since e0100 --json | jq .sent
    """
    from nightlab.trackers import export

    done = export(
        lab, tracker, since=since, wave=wave_id, progress=None if as_json else lambda eid: say(f"sent {eid}")
    )
    if as_json:
        emit_json(done)
        return
    click.echo(
        f"{tracker}: {done['sent']} run(s) sent, {done['unchanged']} already up to date, "
        f"{done['incumbent_points']} incumbent point(s) ({done['destination']})"
    )
