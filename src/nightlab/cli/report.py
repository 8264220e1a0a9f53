from __future__ import annotations

import click

from nightlab.cli._common import emit_json, json_option, say, with_lab


@click.command("report")
@click.option(
    "--wide",
    is_flag=True,
    help="Whether or not to also write results-wide.tsv (tier, seed, wave, timings, every metric).",
)
@click.option("--no-plot", is_flag=True, help="Whether or not to skip progress.png.")
@json_option
@with_lab
def command(lab, wide, no_plot, as_json) -> None:
    """Write results.tsv (the autoresearch format) and progress.png in the lab.

    results.tsv holds the default tier; each other tier with results gets results-TIER.tsv.

    \b
    Example:
      nightlab report && column -t -s $'\\t' results.tsv
    """
    from nightlab.ledger import ExperimentStatus
    from nightlab.report import trust_note, write_report

    paths = write_report(lab.ledger, lab.config, lab.path, wide=wide, plot=not no_plot)
    finished = [e for e in lab.ledger.experiments(status=ExperimentStatus.FINISHED) if e.ok]
    note = trust_note(finished, builtin=lab.config.target.builtin)
    if as_json:
        emit_json({"files": [str(p) for p in paths], "not_vouched": note or None})
        return
    for p in paths:
        click.echo(p)
    if note:
        say(f"not vouched for by the harness: {note} (docs/integrity.md; `trust` in results-wide.tsv)")
    say(
        f"results.tsv (tier {lab.config.fleet.default_tier}) reads like autoresearch's; "
        "progress.png shows every run and the incumbent's figure"
    )
