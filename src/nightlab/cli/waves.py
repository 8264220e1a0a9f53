from __future__ import annotations

import click

from nightlab.cli._common import console, emit_json, fmt, json_option, say, with_lab


def _show(lab, status) -> None:
    from rich.table import Table

    out = console()
    w, metric = status.wave, status.metric
    inc = status.incumbent
    out.print(
        f"{w.id} {w.design} on {w.tier}: {w.description}\n"
        f"{status.finished} ok, {status.crashed} failed, "
        + (f"{status.cancelled} cancelled, " if status.cancelled else "")
        + f"{status.pending} pending; incumbent "
        + ("unmeasured" if inc is None else f"{metric} {inc.mean:.6f} (n={inc.n})")
    )
    table = Table(box=None, pad_edge=False)
    for col in ("id", "status", metric, "verdict", "seed", "role", "knobs"):
        table.add_column(col, justify="right" if col in (metric, "seed") else "left", no_wrap=col != "knobs")
    from nightlab.waves import wave_points

    points = {e.id: knobs for e, knobs in wave_points(lab, w)}
    for e in status.runs:
        value = fmt(e.metric(metric)) if e.ok else (e.outcome or e.status.label)
        knobs = " ".join(f"{k}={v}" for k, v in points.get(e.id, e.params).items())
        role = "reused" if e.wave != w.id else e.source
        table.add_row(e.id, e.status.label, value, e.verdict or "-", str(e.seed), role, knobs)
    out.print(table)
    p = status.promotion
    if p is not None:
        for origin, screen in p["screen"].items():
            val = p["validation"].get(origin)
            out.print(
                f"{origin}: screen {screen:.6f} -> {w.tier} {fmt(val)}  {p['verdicts'].get(origin) or '-'}"
            )
        rho = p["rank_correlation"]
        out.print(
            "rank correlation between tiers: "
            + ("n/a (needs 3 candidates measured on both)" if rho is None else f"{rho:+.2f}")
        )
        out.print("kept on " + w.tier + ": " + (", ".join(p["kept"]) or "none"))


@click.command("waves")
@click.argument("wave_id", required=False, metavar="[WAVE]")
@json_option
@with_lab
def command(lab, wave_id, as_json) -> None:
    """List waves, or show one: its runs, verdicts and (for promotions) the tier comparison.

    \b
    Example:
      nightlab waves --json | jq -r '.[] | select(.pending == 0) | .id'
    """
    from nightlab.waves import wave_status

    if wave_id:
        status = wave_status(lab, wave_id)
        if as_json:
            emit_json(status.to_dict())
            return
        _show(lab, status)
        return
    statuses = [wave_status(lab, w.id) for w in lab.ledger.waves()]
    if as_json:
        emit_json(
            [{k: v for k, v in s.to_dict().items() if k not in ("experiments", "spec")} for s in statuses]
        )
        return
    if not statuses:
        say("no waves yet; start one with `nightlab sweep` or `nightlab noise`")
        return
    metric = lab.config.metric.name
    click.echo(
        f"{'wave':<6} {'design':<17} {'tier':<6} {'ok':>4} {'fail':>4} {'canc':>4} {'pend':>4} {'best':<6} {metric:>9}  description"
    )
    for s in statuses:
        best = s.best
        click.echo(
            f"{s.wave.id:<6} {s.wave.design:<17} {s.wave.tier or '-':<6} {s.finished:>4} {s.crashed:>4} "
            f"{s.cancelled:>4} {s.pending:>4} {best.id if best else '-':<6} {fmt(best.metric(metric)) if best else '-':>9}  "
            f"{s.wave.description[:60]}"
        )
