from __future__ import annotations

import click

from nightlab.cli._common import emit_json, json_option, say, with_lab


@click.command("rungs")
@json_option
@with_lab
def command(lab, as_json) -> None:
    """Rank transfer between screening rungs, measured on this lab's promoted runs.

    For each rung and the rung it promotes to: Spearman's rank correlation of the promoted
    snapshots' means on the two, with a 95 % interval, and a warning when screening misleads;
    and a warning when a rung's runs spent their untimed warm-up's cap (a quarter of the budget)
    compiling, so the compile ran into their timed budget.

    \b
    Example:
      nightlab rungs --json | jq '.[] | {rung, rho, interval}'
    """
    from nightlab.rungs import budget_of, transfer

    rows = transfer(lab)
    if as_json:
        emit_json(rows)
        return
    measured = [r for r in rows if r["n"]]
    if not measured:
        say("no promoted runs yet: screen with `nightlab submit --screen` or `nightlab search --screen-tier`")
    for r in rows:
        if (r.get("warmup") or {}).get("warning"):
            say(f"warning: {r['warmup']['warning']}")
    for r in measured:
        low, high = budget_of(lab.config, r["rung"]), budget_of(lab.config, r["next"])
        budgets = f" ({low:g} s -> {high:g} s)" if low is not None and high is not None else ""
        rho = "unmeasured" if r["rho"] is None else f"{r['rho']:+.2f}"
        ci = (
            ""
            if r["interval"] is None
            else f", 95 % interval [{r['interval'][0]:+.2f}, {r['interval'][1]:+.2f}]"
        )
        click.echo(f"{r['rung']} -> {r['next']}{budgets}: rank correlation {rho}{ci}, n={r['n']}")
        if r["warning"]:
            say(f"warning: {r['warning']}")
