"""Reading waves: their runs and candidates, the incumbent's figure, effects and noise tables.

Reading writes nothing: verdicts are the stored ones, kept current by the controller's judge.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nightlab.analysis import ok_values
from nightlab.errors import UsageError
from nightlab.ledger import LEGACY_IDENTITY_KEY, Experiment, ExperimentStatus, SearchProgress, Verdict, Wave

if TYPE_CHECKING:
    from nightlab.lab import Lab


@dataclass(frozen=True)
class WaveStatus:
    """A wave as it stands: its runs (members plus reused measurements) and what they show."""

    wave: Wave
    runs: tuple[Experiment, ...]
    metric: str
    lower_is_better: bool
    incumbent: Any  # analysis.Figure on the wave's tier, or None
    promotion: dict[str, Any] | None = None
    search: SearchProgress | None = None  # the record of a wave of `nightlab search`

    @property
    def candidates(self) -> tuple[Experiment, ...]:
        """The runs that stand for the wave's ideas (`is_candidate`)."""
        return tuple(e for e in self.runs if is_candidate(e, self.wave))

    @property
    def pending(self) -> int:
        return sum(1 for e in self.runs if not e.status.is_finished())

    @property
    def crashed(self) -> int:
        """Runs that ended without a result (crash, timeout, invalid); cancelled ones are `cancelled`."""
        return sum(1 for e in self.runs if e.status == ExperimentStatus.FINISHED and not e.ok)

    @property
    def cancelled(self) -> int:
        return sum(1 for e in self.runs if e.status == ExperimentStatus.CANCELLED)

    @property
    def finished(self) -> int:
        return sum(1 for e in self.runs if e.ok)

    @property
    def best(self) -> Experiment | None:
        ok = [e for e in self.candidates if e.ok and e.metric(self.metric) is not None]
        if not ok:
            return None
        sign = 1 if self.lower_is_better else -1
        return min(ok, key=lambda e: sign * e.metric(self.metric))

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {
            "id": self.wave.id,
            "design": self.wave.design,
            "description": self.wave.description,
            "tier": self.wave.tier,
            "created_at": self.wave.created_at,
            "runs": len(self.runs),
            "finished": self.finished,
            "crashed": self.crashed,
            "cancelled": self.cancelled,
            "pending": self.pending,
            "best": None if best is None else {"id": best.id, self.metric: best.metric(self.metric)},
            "incumbent": None if self.incumbent is None else self.incumbent.__dict__,
            "promotion": self.promotion,
            "experiments": [e.brief(self.metric) for e in self.runs],
            "spec": self.wave.spec,
            "search": None if self.search is None else self.search.to_dict(),
        }


def wave_runs(lab: Lab, wave: Wave) -> list[Experiment]:
    """A wave's runs: its members and the earlier measurements it reused, in submission order."""
    members = lab.ledger.experiments(wave=wave.id)
    reused_ids = [i for i in wave.spec.get("reused", {}).values() if i not in {e.id for e in members}]
    reused = lab.ledger.experiments(ids=reused_ids) if reused_ids else []
    return sorted([*members, *reused], key=lambda e: e.seq)


def wave_points(lab: Lab, wave: Wave) -> list[tuple[Experiment, dict[str, str]]]:
    """The wave's candidate runs with the knob values each ran with.

    Members submitted as candidates carry their knobs as params; design points that reused an
    earlier measurement take their knobs from the wave's planned runs.
    """
    planned = wave.spec.get("runs", [])
    reused = {eid: dict(planned[int(i)]) for i, eid in wave.spec.get("reused", {}).items()}
    return [(e, reused.get(e.id, dict(e.params))) for e in wave_runs(lab, wave) if is_candidate(e, wave)]


def is_candidate(e: Experiment, wave: Wave) -> bool:
    """Whether a run of the wave stands for one of its ideas: a member submitted as a candidate
    (`Source.is_candidate`: not the incumbent's re-measurement, noise runs or settle repeats), or an
    earlier measurement a design point reused."""
    return e.id in wave.spec.get("reused", {}).values() or (e.wave == wave.id and e.source.is_candidate)


def _promotion(lab: Lab, wave: Wave, runs: Sequence[Experiment]) -> dict[str, Any]:
    """Screen means against validation means of each promoted candidate, and their rank correlation."""
    from nightlab.search.decide import spearman

    metric = lab.config.metric.name
    screen: dict[str, float] = wave.spec.get("screen", {})
    validation: dict[str, float] = {}
    verdicts: dict[str, str | None] = {}
    by_id = {e.id: e for e in runs}
    for origin, new_ids in wave.spec.get("promoted", {}).items():
        mine = [by_id[i] for i in new_ids if i in by_id]
        if not mine:
            continue
        values = ok_values(lab.ledger.experiments(identity=mine[0].identity, tier=wave.tier), metric)
        if values:
            validation[origin] = statistics.fmean(values)
        verdicts[origin] = next((e.verdict for e in mine if e.verdict is not None), None)
    return {
        "screen": screen,
        "validation": validation,
        "verdicts": verdicts,
        "kept": [i for i, v in verdicts.items() if v == Verdict.KEEP],
        "rank_correlation": spearman(screen, validation),
    }


def wave_status(lab: Lab, wave_id: str) -> WaveStatus:
    """The wave's runs with their stored verdicts (reading writes nothing: the controller's judge
    keeps them current), the incumbent's figure, its best candidate and, for promotions, the tier report.

    Raises:
        UnknownExperimentError: no such wave (exit 2).
    """
    wave = lab.ledger.wave(wave_id)
    runs = wave_runs(lab, wave)
    incumbent = lab.judge().incumbent_figure(wave.tier) if wave.tier else None
    promotion = _promotion(lab, wave, runs) if wave.design == "promote" else None
    search = lab.ledger.search_progress(wave_id)
    return WaveStatus(
        wave,
        tuple(runs),
        lab.config.metric.name,
        lab.config.metric.lower_is_better,
        incumbent,
        promotion,
        search,
    )


def wave_effects(
    lab: Lab, wave_id: str, *, interactions: bool = True
) -> tuple[Any, dict[str, dict[float, str]]]:
    """Effects of the wave's factors on the metric, by least squares on coded levels.

    Returns:
        The `EffectsResult` (its `message` says when runs are pending or crashed) and, per factor,
        coded level -> the knob's source text, to read `predicted_best` as knob values.

    Raises:
        UsageError: the wave has no search spaces (a noise or promotion wave).
    """
    from nightlab.search.designs import Design
    from nightlab.search.effects import estimate_effects
    from nightlab.search.spaces import coded_levels, parse_space

    wave = lab.ledger.wave(wave_id)
    if not wave.spec.get("spaces"):
        raise UsageError(
            f"wave `{wave_id}` ({wave.design}) has no factors; effects need a sweep or search wave"
        )
    design = Design.from_dict(wave.spec["design"]) if wave.spec.get("design") else None
    if design is not None:
        factors = design.factors
    else:
        dims = [parse_space(s) for s in wave.spec["spaces"]]
        factors = tuple(d.name for d in dims)
    metric = lab.config.metric.name
    rows, y, values = [], [], {f: {} for f in factors}
    crashed = pending = 0
    for e, knobs in wave_points(lab, wave):
        if not e.status.is_finished():
            pending += 1
            continue
        value = e.metric(metric) if e.ok else None
        if value is None:
            crashed += 1 if e.status == ExperimentStatus.FINISHED else 0
            continue
        if design is not None:
            coded = next((design.coded[i] for i, r in enumerate(design.runs) if r == knobs), None)
            if coded is None:
                continue
        else:
            coded = coded_levels(dims, knobs)
        rows.append(coded)
        y.append(value)
        for f in factors:
            values[f].setdefault(coded[f], knobs[f])
    result = estimate_effects(
        rows,
        y,
        factors,
        interactions=interactions,
        lower_is_better=lab.config.metric.lower_is_better,
        crashed=crashed,
        pending=pending,
    )
    return result, values


@dataclass(frozen=True)
class SnapshotFigure:
    """Mean, standard deviation and count of one snapshot's ok runs on one tier (n >= 2)."""

    identity: str
    tier: str
    mean: float
    std: float
    n: int
    experiments: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        return {**d, LEGACY_IDENTITY_KEY: self.identity}


def noise_table(
    lab: Lab, tier: str | None = None
) -> tuple[list[SnapshotFigure], dict[str, tuple[float | None, int]]]:
    """Every snapshot with repeats, per tier, and each tier's pooled noise floor (sigma, dof)."""
    from nightlab.analysis import noise_sigma

    metric = lab.config.metric.name
    groups: dict[tuple[str, str], list[Experiment]] = {}
    for e in lab.ledger.experiments(status=ExperimentStatus.FINISHED, tier=tier):
        if e.ok and e.metric(metric) is not None:
            groups.setdefault((e.identity, e.tier), []).append(e)
    figures = []
    for (ident, t), exps in groups.items():
        if len(exps) > 1:
            values = [e.metric(metric) for e in exps]
            figures.append(
                SnapshotFigure(
                    ident,
                    t,
                    statistics.fmean(values),
                    statistics.stdev(values),
                    len(values),
                    tuple(e.id for e in exps),
                )
            )
    tiers = [tier] if tier else lab.config.fleet.tiers
    from nightlab.identity import epoch_key

    floors = {t: noise_sigma(lab.ledger, metric, t, epoch=epoch_key(lab.config)) for t in tiers}
    return sorted(figures, key=lambda f: (f.tier, f.experiments[0])), floors


def default_plot_path(lab: Lab, wave_id: str) -> Path:
    """Where `nightlab effects` saves a wave's main-effects plot."""
    return lab.path / ".nightlab" / "effects" / f"{wave_id}.png"
