from __future__ import annotations

import click

from nightlab.cli._common import console, emit_json, fmt, json_option, say, with_lab
from nightlab.views import every_result_payload, results_payload

DEFAULT_ROWS = 15


def verdict_cell(row) -> str:
    """The verdict as a listing shows it (`judge.verdict_label`)."""
    from nightlab.judge import verdict_label

    return verdict_label(
        row.experiment.verdict,
        incumbent=row.incumbent,
        earlier_incumbent=row.earlier_incumbent,
        earlier_figure=row.earlier_figure,
    )


def _rerun_note(lab, row) -> str:
    """What became of a degraded run: its one re-run (and how that ended), or that it is the re-run."""
    of, rerun = lab.ledger.rerun_links(row.experiment.id)
    if of is not None:
        return f"it is the re-run of {of}: not re-run again"
    if rerun is None:
        return "to be re-run once"
    again = lab.ledger.get(rerun)
    return f"re-run as {again.id} ({again.outcome or again.status.label})"


@click.command("results")
@click.option("--tier", default=None, help="Only this tier (results are never compared across tiers).")
@click.option(
    "--all", "all_", is_flag=True, help="Whether or not to list every experiment (default: the top ones)."
)
@click.option(
    "-n",
    "limit",
    type=click.IntRange(min=0),
    default=None,
    help=f"Rows to show (default: {DEFAULT_ROWS} in the table, every experiment with --json).",
)
@json_option
@with_lab
def command(lab, tier, all_, limit, as_json) -> None:
    """Experiments sorted by the metric, with the delta against the incumbent of the same tier.

    \b
    Every experiment is ranked from a few columns; only the rows shown are read in full, so
    the table (and `--json -n N`) stays fast on a ledger of tens of thousands of runs.

    \b
    Example:
      nightlab results --json | jq '.experiments[] | select(.verdict == "keep") | .id'
    """
    from nightlab.analysis import ranking, result_rows
    from nightlab.harness.owned import TRUST_NOTES

    if tier is not None:
        lab.check_tier(tier)
    metric = lab.config.metric.name
    judge = lab.judge()
    if as_json and (all_ or limit is None):
        emit_json(every_result_payload(lab, tier=tier))
        return
    ranked, incumbents = ranking(lab.ledger, lab.config, lab.path, tier=tier)
    if as_json:
        emit_json(
            results_payload(lab, ranked, incumbents, result_rows(lab.ledger, ranked[:limit], tier=tier))
        )
        return
    out = console()
    from nightlab.identity import epoch_info, epoch_line

    epoch = epoch_info(lab.path, lab.ledger, lab.config)
    line = epoch_line(epoch)
    if line and epoch["since"] is not None:  # a fresh change is already announced on opening the lab
        say(line)
    _print_incumbents(out, lab.head(), incumbents, metric)
    limit = DEFAULT_ROWS if limit is None else limit
    shown = result_rows(
        lab.ledger,
        ranked if all_ else [r for r in ranked if r.value is not None or r.key.degraded][:limit],
        tier=tier,
    )
    out.print(_table(lab, shown, metric, judge))
    if not lab.config.target.builtin:
        say(f"self-reported: {TRUST_NOTES['self-reported']} (a foreign target computes its own metric)")
    _say_footnotes(lab, ranked, shown, incumbents, all_=all_)
    _say_settle_hints(judge, shown)


def _print_incumbents(out, head: str, incumbents: dict, metric: str) -> None:
    """One line per tier: the incumbent's figure, or how to measure it."""
    for t, f in incumbents.items():
        if f is None:
            out.print(f"incumbent {head[:10]} on {t}: not measured; run `nightlab noise --tier {t}`")
        else:
            spread = f" ± {f.std:.6f}" if f.std is not None else ""
            out.print(f"incumbent {head[:10]} on {t}: {metric} {f.mean:.6f}{spread} (n={f.n})")


def _table(lab, shown: list, metric: str, judge):
    """The rows shown, as a rich Table."""
    from rich.table import Table

    from nightlab.rungs import tier_label

    table = Table(box=None, pad_edge=False)
    for col in ("id", "tier", metric, "delta", "verdict", "trust", "seed", "description"):
        table.add_column(
            col, justify="right" if col in (metric, "delta", "seed") else "left", no_wrap=col != "description"
        )
    for r in shown:
        e = r.experiment
        if r.value is None and e.degraded and e.metric(metric) is not None:
            value = f"({fmt(e.metric(metric))})"  # recorded, never compared: see the line below the table
        else:
            value = fmt(r.value) if r.value is not None else (e.outcome or e.status.label)
        delta = "-" if r.delta is None else f"{r.delta:+.6f}"
        vouched = judge.trust(e) or "-"  # a queued or running run has no figures to vouch for
        table.add_row(
            e.id,
            tier_label(lab.config, e.tier),
            value,
            delta,
            verdict_cell(r),
            vouched,
            str(e.seed),
            e.description[:60],
        )
    return table


def _say_footnotes(lab, ranked: list, shown: list, incumbents: dict, *, all_: bool) -> None:
    """The counts by outcome, then a note for each kind of row the table alone would mislead on."""
    counts: dict[str, int] = {}
    for r in ranked:
        key = r.key.outcome or r.key.status.label
        counts[key] = counts.get(key, 0) + 1
    say(
        ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) + ("" if all_ else "  (--all for every row)")
    )
    for r in shown:  # the rows shown only: `-n 2` gets no footnote for a row it left out
        if r.experiment.degraded:
            say(
                f"{r.experiment.id} {r.experiment.detail} (not judged, not in any figure; {_rerun_note(lab, r)})"
            )
    earlier = [r for r in shown if r.earlier_incumbent]
    if earlier:
        j = earlier[0].experiment.judged or {}
        against = f"{j.get('incumbent', '?')[:10]}'s {fmt(j.get('mean'))} (n={j.get('n', 0)})"
        say(
            f"{len(earlier)} verdict(s) marked `vs earlier incumbent` were judged before today's incumbent "
            f"(e.g. {earlier[0].experiment.id} against {against}); their delta is against today's"
        )
    moved = [r for r in shown if r.earlier_figure]
    if moved:
        j = moved[0].experiment.judged or {}
        now = incumbents.get(moved[0].experiment.tier)
        today = f"{fmt(now.mean)} (n={now.n})" if now else "unmeasured"
        say(
            f"{len(moved)} verdict(s) marked `vs earlier figure` were judged when the incumbent's figure was "
            f"another (e.g. {moved[0].experiment.id} against {fmt(j.get('mean'))} (n={j.get('n', 0)}), "
            f"today {today}); their delta is against today's"
        )


def _say_settle_hints(judge, shown: list) -> None:
    """How to settle each within-noise candidate shown, once per files and tier."""
    seen = set()
    inc = judge.incumbent()
    for r in shown:
        e = r.experiment
        # the incumbent is never a candidate: no hint to "settle" it against itself
        if e.verdict == "within-noise" and not r.incumbent and (e.identity, e.tier) not in seen:
            seen.add((e.identity, e.tier))
            say(judge.settle_hint(e, inc))
