"""Reports: `results.tsv` in the autoresearch format, a wider export, `progress.png`, and
`costs.md` (time and money per remote worker, see `fleet/costs.py`) for labs with SkyPilot pools,
and the agent's API cost per night next to it (`agent/costs.py`) for labs where an agent ran.

results.tsv is what existing autoresearch notebooks read, so its shape is fixed:
tab-separated, header `commit <metric> memory_gb status description`, the short hash of
the snapshot, memory = peak_vram_mb / 1024 with one decimal, crashes as 0.000000 / 0.0,
status keep (the runs of adopted snapshots and the baseline), discard or crash: `judge.tsv_status`
says which, so a `keep` verdict that was never adopted is `discard` here (it is not on the branch).

Results compare only within a tier, so results.tsv holds the lab's default tier
(`fleet.default_tier`) and every other tier with finished runs gets its own
`results-<tier>.tsv` of the same shape; a lab of one tier has just results.tsv. The wide export
has a tier column and holds them all. `nightlab init` lists these files in the lab's .gitignore.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nightlab.agent.costs import agent_cost_markdown, agent_cost_summary
from nightlab.atomic import atomic_path, atomic_write_text
from nightlab.config import LabConfig
from nightlab.display import exact
from nightlab.fleet.costs import cost_markdown, cost_summary
from nightlab.judge import kept as is_kept
from nightlab.judge import trust, tsv_status
from nightlab.ledger import Experiment, ExperimentStatus, Ledger, Verdict

_FIXED_WIDE = ("tier", "seed", "wave", "outcome", "verdict", "submitted_at", "started_at", "finished_at")


def adopted_identities(exps: Iterable[Experiment]) -> set[str]:
    """The snapshots the lab adopted (an adopted snapshot is the incumbent on every tier)."""
    return {e.identity for e in exps if e.adopted_at is not None}


def _clean(text: str) -> str:
    return " ".join(text.split())


def results_tsv(ledger: Ledger, config: LabConfig, *, wide: bool = False, tier: str | None = None) -> str:
    """The text of results.tsv: finished experiments in submission order, of one `tier` (or all)."""
    metric = config.metric.name
    finished = ledger.experiments(status=ExperimentStatus.FINISHED)
    adopted = adopted_identities(finished)
    exps = [e for e in finished if tier is None or e.tier == tier]
    extra: list[str] = []
    if wide:
        keys = sorted({k for e in exps for k in e.metrics} - {metric, "peak_vram_mb"})
        extra = [*_FIXED_WIDE, "trust", *keys]
    lines = ["\t".join(["commit", metric, "memory_gb", "status", "description", *extra])]
    for e in exps:
        status = tsv_status(e, adopted)
        value = e.metric(metric) if status != "crash" else None
        vram = e.metric("peak_vram_mb") if status != "crash" else None
        row = [
            e.snapshot[:7],
            f"{value:.6f}" if value is not None else "0.000000",
            f"{vram / 1024:.1f}" if vram is not None else "0.0",
            status,
            _clean(e.description) + (f" [degraded: {_clean(e.detail or '')}]" if e.degraded else ""),
        ]
        if wide:
            for col in _FIXED_WIDE:
                v = getattr(e, col)
                row.append("" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v)))
            row.append(trust(e, config))
            row += [_clean(exact(e.metrics.get(k))) for k in extra[len(_FIXED_WIDE) + 1 :]]
        lines.append("\t".join(row))
    return "\n".join(lines) + "\n"


def kept_snapshots(kept: Iterable[Experiment], metric: str) -> list[tuple[Experiment, float]]:
    """Each kept snapshot (per tier) in the order it was kept: (the run where it entered, its figure).

    The entry is the snapshot's adopted run, else (the baseline) its first run; the figure is the
    mean of all its kept runs on that tier. The incumbent lines of progress.png and of the
    dashboard step on these figures, so a single lucky seed does not look like progress.
    """
    snapshots: dict[tuple[str, str], list[Experiment]] = {}
    for e in kept:
        snapshots.setdefault((e.tier, e.identity), []).append(e)
    out = []
    for runs in snapshots.values():
        adopted = [r for r in runs if r.adopted_at is not None]
        entry = min(adopted or runs, key=lambda r: r.seq)
        values = [r.metric(metric) for r in runs]
        out.append((entry, sum(values) / len(values)))
    return sorted(out, key=lambda pair: pair[0].seq)


def trust_note(exps: Iterable[Experiment], *, builtin: bool) -> str:
    """How many of these results the harness does not vouch for, e.g. "3 self-reported"; "" if none.

    results.tsv's columns are autoresearch's and cannot carry it, so the report says it here
    (the plot's titles and `nightlab report`'s message); results-wide.tsv has a `trust` column.
    """
    from collections import Counter

    from nightlab.harness.owned import trust

    counts = Counter(trust(e.metrics, builtin=builtin) for e in exps)
    return ", ".join(f"{counts[k]} {k}" for k in ("self-reported", "unsandboxed") if counts[k])


def _entry_label(entry: Experiment) -> str:
    """How progress.png names a snapshot on the incumbent line: the baseline, a kept change, or a
    forced adoption (adopted without a `keep`: it says so, never "kept")."""
    if entry.verdict == Verdict.BASELINE:
        return "baseline"
    if entry.verdict == Verdict.KEEP:
        return f"kept {entry.id}: {entry.description[:40]}"
    return f"adopted {entry.id} by force ({entry.verdict or 'no verdict'}): {entry.description[:40]}"


# the runs of a panel that are neither kept nor `keep`, by verdict: (label, colour, size, z-order);
# None also draws any verdict not listed (an ok run is one of these three or not judged)
_OTHERS = (
    # gained, but not by more than the noise yet: the night's best is often one of these
    (Verdict.WITHIN_NOISE, "within noise (not settled)", "#e9a23b", 22, 3),
    (Verdict.DISCARD, "discarded", "#b0b0b0", 14, 2),
    (None, "not judged (incumbent unmeasured)", "#9fa8da", 14, 2),
)
_SHOWN = {v for v, *_ in _OTHERS if v is not None}


def progress_png(ledger: Ledger, config: LabConfig, path: Path) -> None:
    """Every ok experiment as a dot in submission order, coloured by verdict, kept ones highlighted,
    the incumbent's figure as a step line labelled with each kept change; one panel per tier. The
    degraded runs (never judged) are not drawn: each panel's title counts them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = config.metric.name
    finished = ledger.experiments(status=ExperimentStatus.FINISHED)
    exps = [e for e in finished if e.ok and e.metric(metric) is not None]
    degraded: dict[str, int] = {}
    for e in finished:
        if e.degraded:
            degraded[e.tier] = degraded.get(e.tier, 0) + 1
    tiers = sorted({e.tier for e in exps} | set(degraded)) or ["-"]
    adopted = adopted_identities(exps)
    fig, axes = plt.subplots(len(tiers), 1, figsize=(11, 4.2 * len(tiers)), squeeze=False)
    for ax, tier in zip(axes[:, 0], tiers, strict=True):
        _progress_panel(ax, [e for e in exps if e.tier == tier], tier, config, adopted, degraded.get(tier, 0))
    fig.tight_layout()
    with atomic_path(path) as tmp:  # keeps the `.png` suffix savefig reads the format from
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


def _progress_panel(
    ax: Any, mine: list[Experiment], tier: str, config: LabConfig, adopted: set[str], starved: int
) -> None:
    """One tier's panel of `progress_png`: its runs as dots, the incumbent's step line, the title."""
    metric = config.metric.name
    # kept = the baseline and what was adopted (`judge.kept`); a run that beat the incumbent too
    # but lost to the wave's best carries the verdict `keep` without being adopted: drawn apart
    kept = [e for e in mine if is_kept(e, adopted)]
    beat = [e for e in mine if e.verdict == Verdict.KEEP and e not in kept]
    rest = [e for e in mine if e not in kept and e not in beat]
    layers = []
    for verdict, label, color, size, z in _OTHERS:
        group = [e for e in rest if e.verdict == verdict or (verdict is None and e.verdict not in _SHOWN)]
        if group:
            layers.append((group, label, color, size, z))
    if beat:
        layers.append((beat, "beat the incumbent, not adopted", "#8fd19e", 24, 3))
    layers.append((kept, "kept", "#2a9d4b", 36, 3))  # always: its legend entry says none was kept
    for runs, label, color, size, z in layers:
        ax.scatter(
            [e.seq for e in runs],
            [e.metric(metric) for e in runs],
            s=size,
            color=color,
            label=label,
            zorder=z,
        )
    _incumbent_steps(ax, kept, [e.seq for e in mine], config)
    note = trust_note(mine, builtin=config.target.builtin)
    ax.set_title(
        f"tier {tier}: {len(mine)} ok runs{f' ({note})' if note else ''}, "
        f"{len({e.identity for e in kept})} kept snapshots"
        + (f"; {starved} degraded runs not drawn (starved or throttled: never judged)" if starved else "")
    )
    ax.set_xlabel("experiment #")
    ax.set_ylabel(f"{metric} ({'lower' if config.metric.lower_is_better else 'higher'} is better)")
    ax.grid(alpha=0.3)
    if mine:
        ax.legend(loc="upper right", fontsize=8)
    elif starved:
        ax.text(0.5, 0.5, "no ok run: every run here was degraded", ha="center", transform=ax.transAxes)


def _incumbent_steps(ax: Any, kept: list[Experiment], xs: list[int], config: LabConfig) -> None:
    """The incumbent's best mean so far as a step line, each kept change labelled where it came in."""
    better = min if config.metric.lower_is_better else max
    best, step_x, step_y = None, [], []
    for entry, mean in kept_snapshots(kept, config.metric.name):
        best = mean if best is None else better(best, mean)
        step_x.append(entry.seq)
        step_y.append(best)
        ax.annotate(
            _entry_label(entry),
            (entry.seq, mean),
            fontsize=7,
            rotation=20,
            xytext=(4, 6),
            textcoords="offset points",
            color="#1d6b34",
        )
    if step_x:
        step_x.append(max(xs))
        step_y.append(step_y[-1])
        ax.step(
            step_x,
            step_y,
            where="post",
            color="#2a9d4b",
            linewidth=1.5,
            label="incumbent (mean)",
            zorder=1,
        )


def write_report(
    ledger: Ledger, config: LabConfig, lab_dir: Path, *, wide: bool = False, plot: bool = True
) -> list[Path]:
    """Write results.tsv (the default tier), results-<tier>.tsv for each other tier with finished
    runs, results-wide.tsv with `wide`, and progress.png into the lab."""
    written = []
    default = config.fleet.default_tier
    tsv = lab_dir / "results.tsv"
    atomic_write_text(tsv, results_tsv(ledger, config, tier=default))
    written.append(tsv)
    others = sorted(
        {e.tier for e in ledger.experiments(status=ExperimentStatus.FINISHED, with_metrics=False)}
    )
    for tier in (t for t in others if t != default):
        path = lab_dir / f"results-{re.sub(r'[^A-Za-z0-9_.-]', '_', tier)}.tsv"  # a tier name is free text
        atomic_write_text(path, results_tsv(ledger, config, tier=tier))
        written.append(path)
    if wide:
        wide_path = lab_dir / "results-wide.tsv"
        atomic_write_text(wide_path, results_tsv(ledger, config, wide=True))
        written.append(wide_path)
    if plot:
        png = lab_dir / "progress.png"
        progress_png(ledger, config, png)
        written.append(png)
    costs = cost_summary(ledger)  # only labs that ran remote (SkyPilot) workers
    api = agent_cost_summary(ledger)  # only labs where an agent ran
    if costs is not None or api is not None:
        parts = [] if costs is None else [cost_markdown(costs)]
        if api is not None:
            parts.append(agent_cost_markdown(api, gpu_cost=None if costs is None else costs["total_cost"]))
        costs_path = lab_dir / "costs.md"
        atomic_write_text(costs_path, "\n".join(parts))
        written.append(costs_path)
    return written
