from __future__ import annotations

import click

from nightlab.cli._common import emit_json, json_option, say, with_lab


@click.command("promote")
@click.argument("ids", nargs=-1, metavar="ID...")
@click.option("--tier", required=True, help="The tier to re-run them on (the validation tier).")
@click.option(
    "--repeats", type=click.IntRange(min=1), default=2, show_default=True, help="Runs of each on that tier."
)
@click.option(
    "--wave",
    "wave_id",
    default=None,
    metavar="WAVE",
    help="Screen-and-promote: take the top k of this wave that beat the incumbent, instead of IDs.",
)
@click.option(
    "--top",
    "top_k",
    type=click.IntRange(min=1),
    default=None,
    help="k for --wave (default [search] promote_top_k).",
)
@json_option
@with_lab
def command(lab, ids, tier, repeats, wave_id, top_k, as_json) -> None:
    """Re-run snapshots on another tier, with repeats, to judge them there.

    The incumbent is measured on that tier too when it has too few runs there. Once the
    runs end, `nightlab waves WAVE` shows each candidate's verdict on the new tier and the
    rank correlation between the tiers.

    \b
    Example:
      nightlab promote --wave w004 --tier h200 --top 3 --repeats 3
    """
    from nightlab.errors import UsageError
    from nightlab.waves import promote, promote_wave

    if wave_id and ids:
        raise UsageError("give experiment ids or `--wave`, not both")
    if wave_id:
        wave = promote_wave(lab, wave_id, tier=tier, repeats=repeats, top_k=top_k)
    else:
        wave = promote(lab, ids, tier=tier, repeats=repeats)
    if as_json:
        emit_json(wave.to_dict())
        return
    click.echo(wave.wave.id)
    promoted = wave.wave.spec.get("promoted", {})
    say(
        f"{wave.wave.id}: promoted {', '.join(promoted)} to {wave.wave.tier} x {repeats} "
        f"({len(wave.experiments)} experiments); `nightlab waves {wave.wave.id}` once done"
    )
