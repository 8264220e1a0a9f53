from __future__ import annotations

from pathlib import Path

import click

from nightlab.cli._common import console, emit_json, fmt, json_option, say, with_lab
from nightlab.views import effects_payload, predicted_best


@click.command("effects")
@click.argument("wave_id", metavar="WAVE")
@click.option(
    "--no-interactions", is_flag=True, help="Whether or not to fit main effects only (no two-way terms)."
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where to save the main-effects plot (default: .nightlab/effects/WAVE.png).",
)
@json_option
@with_lab
def command(lab, wave_id, no_interactions, plot_path, as_json) -> None:
    """Main effects and two-way interactions of a wave's factors, by least squares on coded levels.

    Coded levels run from -1 (low) to +1 (high); `effect` is high minus low. A wave still
    running gives a partial result and says how many runs are pending.

    \b
    Example:
      nightlab effects w003 --json | jq '.terms[] | select(.p_value < 0.05)'
    """
    from nightlab.errors import NightlabError
    from nightlab.search.effects import plot_main_effects
    from nightlab.waves import default_plot_path, wave_effects

    result, values = wave_effects(lab, wave_id, interactions=not no_interactions)
    if result.intercept is None:
        raise NightlabError(f"wave `{wave_id}`: {result.message}")
    metric = lab.config.metric.name
    plot = None
    if result.main_effects:
        path = plot_path or default_plot_path(lab, wave_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        plot = str(plot_main_effects(result, path, metric=metric))
    if as_json:
        emit_json(effects_payload(result, values, metric, plot))
        return
    from rich.table import Table

    out = console()
    out.print(
        f"{wave_id}: {result.n_runs} runs, {len(result.factors)} factors, intercept {fmt(result.intercept)}"
    )
    table = Table(box=None, pad_edge=False)
    for col in ("term", "coefficient", "effect", "std err", "p"):
        table.add_column(col, justify="left" if col == "term" else "right", no_wrap=True)
    for t in result.terms:
        p = "-" if t.p_value is None else f"{t.p_value:.3g}"
        table.add_row(t.term, f"{t.coefficient:+.6f}", f"{t.effect:+.6f}", fmt(t.std_error), p)
    out.print(table)
    best = predicted_best(result, values)
    out.print(
        "predicted best: "
        + " ".join(f"{k}={v}" for k, v in best.items())
        + f" -> {metric} {fmt(result.predicted_metric)}"
    )
    if result.message:
        say(result.message)
    if plot:
        say(f"main effects plot: {plot}")
