from __future__ import annotations

import click

from nightlab.cli._common import console, emit_json, fmt, json_option, say, with_lab


@click.command("noise")
@click.option(
    "--repeats", type=click.IntRange(min=2), default=3, show_default=True, help="Runs of the incumbent."
)
@click.option("--tier", default=None, help="Tier to measure (default: fleet.default_tier).")
@click.option("--show", is_flag=True, help="Whether or not to only show the noise floors measured so far.")
@click.option(
    "--wait", "wait_", is_flag=True, help="Whether or not to wait for the runs and show the result."
)
@json_option
@with_lab
def command(lab, repeats, tier, show, wait_, as_json) -> None:
    """Re-run the incumbent with different seeds to measure the noise floor of a tier.

    Verdicts need it: a single run is judged against the incumbent with this spread. `--show`
    lists each tier's pooled floor and every snapshot with repeats (mean, std, n).

    \b
    Example:
      nightlab noise --repeats 4 --wait --json | jq '.tiers'
    """
    from nightlab.waves import noise, noise_table

    if not show:
        wave = noise(lab, repeats=repeats, tier=tier)
        ids = [e.id for e in wave.experiments]
        if not wait_:
            if as_json:
                emit_json(wave.to_dict())
                return
            click.echo(wave.wave.id)
            say(
                f"queued {len(ids)} runs of the incumbent on {wave.wave.tier}; `nightlab noise --show` once done"
            )
            return
        lab.wait(ids, reruns=True)  # a degraded repeat counts in no floor: its re-run does
        tier = wave.wave.tier
    elif tier is not None:
        lab.check_tier(tier)
    figures, floors = noise_table(lab, tier)
    if as_json:
        emit_json(
            {
                "tiers": {t: {"sigma": s, "dof": d} for t, (s, d) in floors.items()},
                "snapshots": [f.to_dict() for f in figures],
            }
        )
        return
    for t, (sigma, dof) in floors.items():
        if sigma is None:
            say(f"tier {t}: no noise floor yet; run `nightlab noise --tier {t}`")
        else:
            click.echo(f"tier {t}: noise floor {sigma:.6f} ({dof} degrees of freedom)")
    if figures:
        from rich.table import Table

        metric = lab.config.metric.name
        table = Table(box=None, pad_edge=False)
        for col in ("tier", "snapshot", "mean " + metric, "std", "n", "runs"):
            table.add_column(col, no_wrap=True)
        for f in figures:
            table.add_row(f.tier, f.identity[:10], fmt(f.mean), fmt(f.std), str(f.n), ",".join(f.experiments))
        console().print(table)
