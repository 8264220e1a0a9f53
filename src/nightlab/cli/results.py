from __future__ import annotations

import click

from nightlab.cli._common import console, emit_json, fmt, json_option, say, with_lab

DEFAULT_ROWS = 15


def results_payload(lab, rows, incumbents) -> dict:
    """The `--json` document of `nightlab results` (the dashboard serves the same one).

    `rows` and `incumbents` are what `analysis.results` returned; `baseline` holds the
    baseline's figure per tier, so "improvement since the baseline" is
    `incumbent.tiers[t].mean - baseline.tiers[t].mean`.
    """
    from nightlab.analysis import baseline_figures
    from nightlab.harness.owned import trust

    metric = lab.config.metric.name
    experiments = []
    for r in rows:
        d = r.to_dict(metric)
        d["trust"] = trust(r.experiment.metrics, builtin=lab.config.target.builtin)
        experiments.append(d)
    return {
        "metric": metric,
        "direction": lab.config.metric.direction,
        "incumbent": {
            "commit": lab.head(),
            "tiers": {t: (f.__dict__ if f else None) for t, f in incumbents.items()},
        },
        "baseline": {
            "tiers": {
                t: (f.__dict__ if f else None)
                for t, f in baseline_figures(
                    lab.config, [r.experiment for r in rows], list(incumbents)
                ).items()
            }
        },
        "self_reported": not lab.config.target.builtin,
        "experiments": experiments,
    }


@click.command("results")
@click.option("--tier", default=None, help="Only this tier (results are never compared across tiers).")
@click.option(
    "--all", "all_", is_flag=True, help="Whether or not to list every experiment (default: the top ones)."
)
@click.option("-n", "limit", type=int, default=DEFAULT_ROWS, show_default=True, help="Rows to show.")
@json_option
@with_lab
def command(lab, tier, all_, limit, as_json) -> None:
    """Experiments sorted by the metric, with the delta against the incumbent of the same tier.

    \b
    Example:
      nightlab results --json | jq '.experiments[] | select(.verdict == "keep") | .id'
    """
    from nightlab.analysis import decide_tree, results, settle_hint
    from nightlab.harness.owned import TRUST_NOTES, trust

    if tier is not None:
        lab.check_tier(tier)
    metric = lab.config.metric.name
    rows, incumbents = results(lab.ledger, lab.config, lab.path, tier=tier)
    if as_json:
        emit_json(results_payload(lab, rows, incumbents))
        return
    from rich.table import Table

    out = console()
    for t, f in incumbents.items():
        if f is None:
            out.print(f"incumbent {lab.head()[:10]} on {t}: not measured; run `nightlab noise --tier {t}`")
        else:
            spread = f" ± {f.std:.6f}" if f.std is not None else ""
            out.print(f"incumbent {lab.head()[:10]} on {t}: {metric} {f.mean:.6f}{spread} (n={f.n})")
    shown = rows if all_ else [r for r in rows if r.value is not None][:limit]
    table = Table(box=None, pad_edge=False)
    for col in ("id", "tier", metric, "delta", "verdict", "trust", "seed", "description"):
        table.add_column(
            col, justify="right" if col in (metric, "delta", "seed") else "left", no_wrap=col != "description"
        )
    for r in shown:
        e = r.experiment
        value = fmt(r.value) if r.value is not None else (e.outcome or e.status.label)
        delta = "-" if r.delta is None else f"{r.delta:+.6f}"
        vouched = trust(e.metrics, builtin=lab.config.target.builtin)
        table.add_row(e.id, e.tier, value, delta, e.verdict or "-", vouched, str(e.seed), e.description[:60])
    out.print(table)
    if not lab.config.target.builtin:
        say(f"self-reported: {TRUST_NOTES['self-reported']} (a foreign target computes its own metric)")
    counts: dict[str, int] = {}
    for r in rows:
        key = r.experiment.outcome or r.experiment.status.label
        counts[key] = counts.get(key, 0) + 1
    say(
        ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + ("" if all_ else "  (--all for every row)")
    )
    seen = set()
    for r in rows:
        e = r.experiment
        if e.verdict == "within-noise" and (e.tree, e.tier) not in seen:
            seen.add((e.tree, e.tier))
            decision = decide_tree(lab.ledger, lab.config, lab.path, e.tree, e.tier)
            say(settle_hint(e, decision))
