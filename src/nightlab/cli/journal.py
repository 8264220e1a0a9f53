from __future__ import annotations

import click

from nightlab.cli._common import emit_json, json_option, with_lab


@click.command("journal")
@click.option(
    "--max-chars",
    type=click.IntRange(min=1000),
    default=None,
    help="Condense themes (dead ends and weaker ideas first) until the text fits.",
)
@json_option
@with_lab
def command(lab, max_chars, as_json) -> None:
    """Every idea tried, with what it changed, its verdict and delta, grouped by theme.

    An idea is one distinct snapshot; repeats and seeds of it are merged. A theme is what
    the ideas touch (knobs, functions); a theme with two or more decided ideas and none
    better than its parent is marked `dead end`. Seed-only changes are listed apart.

    \b
    Example:
      nightlab journal --json | jq '.themes[] | select(.dead_end) | .name'
    """
    from nightlab.agent.journal import build_journal

    journal = build_journal(lab)
    if as_json:
        emit_json(journal.to_dict())
        return
    click.echo(journal.to_text(max_chars=max_chars), nl=False)
