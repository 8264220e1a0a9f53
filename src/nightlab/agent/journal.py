"""The journal: a lab's research history, compact enough for an agent to read in one go.

An *idea* is one distinct snapshot (one research identity, `nightlab.identity`): every
experiment of the same files, on any tier and seed, is a measurement of the same idea. Each idea is shown with what its diff
changes against the incumbent it was derived from (knob values `MATRIX_LR 0.04->0.02`, or
the functions whose code changed, with line counts), its verdict per tier and its delta
against that parent's mean on the same tier.

Ideas are grouped into *themes* by what they touch: the knobs they change and the functions
(`GPT.forward`) or module-level names their other edited lines belong to. A theme with at
least two decided ideas and not one of them better than its parent is a *dead end*: the
restart prompt shows it so a fresh agent does not spend the night re-trying it. One
discarded idea does not make a dead end: `MATRIX_LR 0.04` failing says little about 0.01.

Two kinds of snapshot are not ideas: re-measurements of unchanged files (baseline, noise
runs, repeats of the incumbent) and *seed changes*, whose only edits are a `*SEED*` knob or
lines that mention a seed. A seed that scores well is luck, not research, so seed changes
are listed apart and never counted as progress.

Reading every snapshot's files costs one `git cat-file --batch` process for the whole
ledger, not two git calls per idea (900 experiments: well under a second).

Usage:
    journal = build_journal(lab)
    print(journal.to_text(max_chars=40_000))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nightlab.agent.changes import Change, file_change, merge, read_blobs
from nightlab.analysis import figure, ok_values
from nightlab.ledger import LEGACY_IDENTITY_KEY, Experiment, ExperimentStatus

# Ranks for an idea's overall standing: the best tier result decides.
_RANK = {
    "keep": 0,
    "within-noise": 1,
    "baseline": 2,  # the same files as the lab's first snapshot, reached again
    "discard": 3,
    "pending": 4,
    "crash": 5,
    "invalid": 6,
    "degraded": 7,  # its machine starved it: says nothing about the idea (a re-run does)
    "cancelled": 8,
}
_FAILED = {"discard", "crash", "invalid"}
MAX_THEME_NAME = 3  # touched names shown in a theme's title before "+N"


# ---------------------------------------------------------------------------- ideas and themes


@dataclass(frozen=True)
class TierResult:
    """An idea's standing on one tier."""

    tier: str
    verdict: str  # keep | within-noise | discard | crash | invalid | pending | cancelled
    mean: float | None
    delta: float | None  # mean minus the parent snapshot's mean on this tier
    n: int  # ok runs
    outcome: str | None  # the crash class when nothing ran ok

    def describe(self) -> str:
        if self.mean is None:
            return f"{self.tier} {self.outcome or self.verdict}"
        delta = "" if self.delta is None else f" {self.delta:+.6f}"
        return f"{self.tier} {self.mean:.6f}{delta} (n={self.n})"


@dataclass(frozen=True)
class Idea:
    """One distinct snapshot and everything measured of it."""

    identity: str
    ids: tuple[str, ...]
    description: str
    kind: str  # idea | seed-change | repeat
    change: Change
    results: tuple[TierResult, ...]
    adopted: bool
    seq: int

    @property
    def status(self) -> str:
        if self.adopted:
            return "keep"
        if not self.results:
            return "pending"
        return min((r.verdict for r in self.results), key=lambda v: _RANK.get(v, 9))

    def line(self) -> str:
        ids = self.ids[0] + (f"+{len(self.ids) - 1}" if len(self.ids) > 1 else "")
        status = self.status + (" [adopted]" if self.adopted else "")
        results = "; ".join(r.describe() for r in self.results)
        return f'- {ids} {status}: {results} | "{self.description}" | {self.change.describe()}'

    def to_dict(self) -> dict[str, Any]:
        return {
            "ids": list(self.ids),
            "identity": self.identity,
            LEGACY_IDENTITY_KEY: self.identity,
            "description": self.description,
            "kind": self.kind,
            "status": self.status,
            "adopted": self.adopted,
            "change": self.change.describe(),
            "touched": list(self.change.touched),
            "results": [r.__dict__ for r in self.results],
        }


@dataclass(frozen=True)
class Theme:
    name: str
    ideas: tuple[Idea, ...]

    @property
    def dead_end(self) -> bool:
        decided = [i for i in self.ideas if i.status not in ("pending", "cancelled")]
        pending = any(i.status == "pending" for i in self.ideas)
        return len(decided) >= 2 and not pending and all(i.status in _FAILED for i in decided)

    def best(self, lower_is_better: bool) -> Idea | None:
        scored = [(r.delta, i) for i in self.ideas for r in i.results if r.delta is not None]
        if not scored:
            return None
        sign = 1 if lower_is_better else -1
        return min(scored, key=lambda t: sign * t[0])[1]

    def title(self, lower_is_better: bool) -> str:
        n = len(self.ideas)
        head = f"## {self.name}" + (" [dead end]" if self.dead_end else "")
        head += f": {n} idea{'s' if n != 1 else ''}"
        kept = [i for i in self.ideas if i.status == "keep"]
        if kept:
            head += f", {len(kept)} kept"
        best = self.best(lower_is_better)
        if best is not None:
            delta = min(
                (r.delta for r in best.results if r.delta is not None),
                key=lambda d: d if lower_is_better else -d,
            )
            head += f", best {best.ids[0]} {delta:+.6f}"
        return head


@dataclass(frozen=True)
class Journal:
    metric: str
    direction: str
    incumbent: str
    incumbent_subject: str
    incumbent_figures: dict[str, Any]
    themes: tuple[Theme, ...]
    seed_changes: tuple[Idea, ...]
    repeats: tuple[Idea, ...]
    experiments: int
    in_flight: tuple[str, ...] = field(default=())

    @property
    def ideas(self) -> list[Idea]:
        return [i for t in self.themes for i in t.ideas]

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "direction": self.direction,
            "experiments": self.experiments,
            "incumbent": {
                "commit": self.incumbent,
                "subject": self.incumbent_subject,
                "tiers": self.incumbent_figures,
            },
            "themes": [
                {"name": t.name, "dead_end": t.dead_end, "ideas": [i.to_dict() for i in t.ideas]}
                for t in self.themes
            ],
            "seed_changes": [i.to_dict() for i in self.seed_changes],
            "repeats": [i.to_dict() for i in self.repeats],
            "in_flight": list(self.in_flight),
        }

    def _header(self) -> list[str]:
        lower = self.direction == "lower"
        ideas = self.ideas
        lines = [
            f"# Journal: {_count(self.experiments, 'experiment')}, {_count(len(ideas), 'idea')} in "
            f"{_count(len(self.themes), 'theme')}, {_count(len(self.seed_changes), 'seed change')}; "
            f"{self.metric}, {'lower' if lower else 'higher'} is better",
            f'incumbent {self.incumbent[:10]} "{self.incumbent_subject}"',
        ]
        for tier, f in sorted(self.incumbent_figures.items()):
            if f is None:
                lines.append(f"  {tier}: not measured")
            else:
                spread = f" ± {f['std']:.6f}" if f.get("std") is not None else ""
                lines.append(f"  {tier}: {f['mean']:.6f}{spread} (n={f['n']})")
        lines.append("Each idea: ids status: per tier mean delta-vs-parent (n) | description | what changed")
        return lines

    def to_text(self, *, max_chars: int | None = None) -> str:
        """The journal as text; with `max_chars`, themes are condensed (dead ends and old ideas
        first) until it fits, keeping at least what each theme tried."""
        for keep in (None, 12, 6, 3, 1, 0):
            text = self._render(keep)
            if max_chars is None or len(text) <= max_chars:
                return text
        note = "\n... (journal cut; `nightlab journal` prints all of it)\n"
        return text[: max(0, max_chars - len(note))] + note

    def _render(self, keep: int | None) -> str:
        lower = self.direction == "lower"
        lines = self._header()
        for theme in self.themes:
            lines += ["", theme.title(lower)]
            ideas = list(theme.ideas)
            if keep is None or len(ideas) <= keep:
                lines += [i.line() for i in ideas]
                continue
            shown = sorted(ideas, key=lambda i: _score(i, lower))[:keep] if not theme.dead_end else []
            lines += [i.line() for i in sorted(shown, key=lambda i: i.seq)]
            rest = [i for i in ideas if i not in shown]
            if rest:
                lines.append(
                    f"  also tried ({len(rest)}): "
                    + "; ".join(f"{i.change.describe()} {i.status}" for i in rest)
                )
        if self.seed_changes:
            lines += ["", "## seed changes (not ideas: a lucky seed is not progress)"]
            lines += [i.line() for i in self.seed_changes]
        if self.repeats:
            runs = sum(len(i.ids) for i in self.repeats)
            lines += [
                "",
                f"## re-measurements of unchanged snapshots: {_count(runs, 'run')} of {_count(len(self.repeats), 'snapshot')}",
            ]
            if keep is None:
                lines += [i.line() for i in self.repeats]
        if self.in_flight:
            lines += ["", f"in flight: {', '.join(self.in_flight)}"]
        return "\n".join(lines) + "\n"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _score(idea: Idea, lower_is_better: bool) -> float:
    """Best delta of an idea on any tier, signed so that smaller is better; inf when unmeasured."""
    sign = 1 if lower_is_better else -1
    deltas = [sign * r.delta for r in idea.results if r.delta is not None]
    return min(deltas) if deltas else float("inf")


def _tier_results(
    exps: list[Experiment], parent_values: dict[str, list[float]], metric: str
) -> list[TierResult]:
    out = []
    for tier in sorted({e.tier for e in exps}):
        runs = [e for e in exps if e.tier == tier]
        values = ok_values(runs, metric)
        f = figure(values)
        parent = figure(parent_values.get(tier, []))
        if f is not None:
            verdicts = [e.verdict for e in runs if e.ok and e.verdict]
            verdict = verdicts[-1] if verdicts else "pending"
            delta = None if parent is None else f.mean - parent.mean
            out.append(TierResult(tier, verdict, f.mean, delta, f.n, None))
            continue
        if any(not e.status.is_finished() for e in runs):
            out.append(TierResult(tier, "pending", None, None, 0, None))
            continue
        finished = [e for e in runs if e.status == ExperimentStatus.FINISHED]
        if finished:
            last = finished[-1]
            verdict = last.outcome if last.outcome in ("invalid", "degraded") else "crash"
            outcome = last.outcome
            if last.degraded:  # its figure and why it does not count, never a delta
                value = last.metric(metric)
                shown = f"{value:.6f} " if value is not None else ""
                outcome = f"degraded ({shown}not judged: {last.detail})"
            out.append(TierResult(tier, verdict, None, None, 0, outcome))
        else:
            out.append(TierResult(tier, "cancelled", None, None, 0, "cancelled"))
    return out


def theme_name(touched: tuple[str, ...]) -> str:
    if not touched:
        return "other"
    if len(touched) <= MAX_THEME_NAME:
        return ", ".join(touched)
    return ", ".join(touched[:MAX_THEME_NAME]) + f" +{len(touched) - MAX_THEME_NAME}"


def build_journal(lab) -> Journal:
    """The journal of an open `nightlab.lab.Lab`."""
    from nightlab import snapshots

    config = lab.config
    metric = config.metric.name
    exps = lab.ledger.experiments()
    by_identity: dict[str, list[Experiment]] = {}
    for e in exps:
        by_identity.setdefault(e.identity, []).append(e)
    values: dict[tuple[str, str], list[float]] = {}
    for e in exps:
        v = e.metric(metric) if e.ok else None
        if v is not None:
            values.setdefault((e.identity, e.tier), []).append(v)

    firsts = {ident: group[0] for ident, group in by_identity.items()}
    parents = {ident: first.parent for ident, first in firsts.items() if first.parent}
    parent_identities: dict[str, str | None] = {}
    from nightlab import identity
    from nightlab.errors import NightlabError

    for ident, parent in parents.items():
        try:  # the key runs are pooled on (identity.py), cached per commit
            parent_identities[ident] = identity.of(lab.path, parent)
        except NightlabError:
            parent_identities[ident] = None
    editable = config.target.editable
    specs = []
    for ident, first in firsts.items():
        if ident in parents and parent_identities.get(ident) != ident:
            for name in editable:
                specs += [f"{first.snapshot}:{name}", f"{parents[ident]}:{name}"]
    blobs = read_blobs(lab.path, specs)

    ideas: list[Idea] = []
    for ident, group in by_identity.items():
        first = group[0]
        parent_identity = parent_identities.get(ident)
        if parent_identity == ident or ident not in parents:
            kind, change = "repeat", Change()
        else:
            change = merge(
                file_change(
                    name,
                    blobs.get(f"{parents[ident]}:{name}"),
                    blobs.get(f"{first.snapshot}:{name}"),
                    prefix=len(editable) > 1,
                )
                for name in editable
            )
            kind = "repeat" if change.empty else ("seed-change" if change.seed_only else "idea")
        parent_values = (
            {tier: values.get((parent_identity, tier), []) for tier in {e.tier for e in group}}
            if parent_identity
            else {}
        )
        ideas.append(
            Idea(
                identity=ident,
                ids=tuple(e.id for e in group),
                description=first.description,
                kind=kind,
                change=change,
                results=tuple(_tier_results(group, parent_values, metric)),
                adopted=any(e.adopted_at is not None for e in group),
                seq=first.seq,
            )
        )

    themes: dict[str, list[Idea]] = {}
    for idea in ideas:
        if idea.kind == "idea":
            themes.setdefault(theme_name(idea.change.touched), []).append(idea)
    from nightlab.judge import Judge

    judge = Judge(lab.ledger, config, lab.path)
    inc = judge.incumbent()
    head = inc.commit
    tiers = sorted(set(config.fleet.tiers) | {e.tier for e in exps})
    figures = {}
    for tier in tiers:
        f = judge.incumbent_figure(tier, inc)
        figures[tier] = None if f is None else {"mean": f.mean, "std": f.std, "n": f.n}
    return Journal(
        metric=metric,
        direction=config.metric.direction,
        incumbent=head,
        incumbent_subject=snapshots.git_text(lab.path, "log", "-1", "--format=%s", head),
        incumbent_figures=figures,
        themes=tuple(Theme(name, tuple(group)) for name, group in themes.items()),
        seed_changes=tuple(i for i in ideas if i.kind == "seed-change"),
        repeats=tuple(i for i in ideas if i.kind == "repeat"),
        experiments=len(exps),
        in_flight=tuple(e.id for e in exps if not e.status.is_finished()),
    )
