"""The `nightlab results --json` document (the dashboard's overview and runs table read it too)."""

from __future__ import annotations

from typing import Any


def results_payload(lab: Any, ranked: list, incumbents: dict, rows: list) -> dict[str, Any]:
    """The `--json` document of `nightlab results` (the dashboard serves the same one).

    `ranked` and `incumbents` are what `analysis.ranking` returned, `rows` the decoded
    `analysis.result_rows` of the ones shown (every one, or the first `-n`); `total` counts them
    all. `baseline` holds the baseline's figure per tier, so "improvement since the baseline" is
    `incumbent.tiers[t].mean - baseline.tiers[t].mean`.
    """
    from nightlab.analysis import baseline_figures
    from nightlab.identity import epoch_info

    metric = lab.config.metric.name
    epoch = epoch_info(lab.path, lab.ledger, lab.config)
    # "since the baseline" is within the epoch: an earlier epoch's baseline was measured differently
    same_epoch = [r.key for r in ranked if r.key.epoch == epoch["key"]]
    from nightlab.rungs import screening_waves

    waves = screening_waves(lab)  # each row's promotion decision, read once
    return {
        "metric": metric,
        "direction": lab.config.metric.direction,
        "epoch": epoch,
        "incumbent": {
            "commit": lab.head(),
            "tiers": {t: (f.__dict__ if f else None) for t, f in incumbents.items()},
        },
        "baseline": {
            "tiers": {
                t: (f.__dict__ if f else None)
                for t, f in baseline_figures(lab.config, same_epoch, list(incumbents)).items()
            }
        },
        "self_reported": not lab.config.target.builtin,
        "total": len(ranked),
        "experiments": [result_row(lab, r, waves) for r in rows],
    }


def every_result_payload(lab: Any, *, tier: str | None = None) -> dict[str, Any]:
    """`results_payload` of every experiment (of `tier`): the whole `results --json` document."""
    from nightlab.analysis import every_result
    from nightlab.bulk import gc_paused

    with gc_paused():
        rows, ranked, incumbents = every_result(lab.ledger, lab.config, lab.path, tier=tier)
        return results_payload(lab, ranked, incumbents, rows)


def result_row(lab: Any, row: Any, waves: dict[str, Any] | None = None) -> dict[str, Any]:
    """One decoded `analysis.ResultRow` as the document lists it (with who vouches for its figures)."""
    from nightlab.judge import trust, verdict_context, verdict_label

    d = row.to_dict(lab.config.metric.name)
    d["trust"] = trust(row.experiment, lab.config)
    # what the table prints and the dashboard styles, by the judge's one rule for every listing
    seen = {
        "incumbent": row.incumbent,
        "earlier_incumbent": row.earlier_incumbent,
        "earlier_figure": row.earlier_figure,
    }
    d["verdict_context"] = verdict_context(row.experiment.verdict, **seen)
    d["verdict_label"] = verdict_label(row.experiment.verdict, **seen)
    from nightlab.rungs import rung_info

    d["rung"] = rung_info(lab, row.experiment, waves)  # its budget, and why it was (not) promoted
    return d
