from __future__ import annotations

import click

from nightlab.cli._common import emit_json, json_option, say, with_lab


@click.command("adopt")
@click.argument("experiment_id")
@click.option("--force", is_flag=True, help="Whether or not to adopt a run whose verdict is not `keep`.")
@json_option
@with_lab
def command(lab, experiment_id, force, as_json) -> None:
    """Make EXPERIMENT_ID the incumbent: its files are written and committed on the lab's branch."""
    commit = lab.adopt(experiment_id, force=force)
    if as_json:
        emit_json({"id": experiment_id, "commit": commit})
        return
    click.echo(commit)
    say(f"adopted {experiment_id}: the incumbent is now {commit[:12]}")
