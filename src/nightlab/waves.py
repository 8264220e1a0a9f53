"""Waves in the lab: sweeps, noise-floor runs and promotions, recorded in the ledger and analysed.

`nightlab.search` holds the pure logic (spaces, designs, verdicts, effects); this module runs it
against a lab. Every wave is a ledger row (`waves`) whose `spec` holds what is needed to analyse
or resume it later: the search spaces, the design, the runs asked for, the design points that
reused an earlier measurement, and (for promotions) where each candidate came from.

    wave = submit_sweep(lab, ["LR=log(0.005,0.05)", "WD=0,0.1"], design="full", description="lr x wd")
    lab.wait([e.id for e in wave.experiments])
    result, values = wave_effects(lab, wave.wave.id)

Choices:
- A wave is built around the incumbent: the files of HEAD, not the working tree, so uncommitted
  edits never leak into a sweep.
- A design point whose exact files were already measured on the tier with seed 0 (typically the
  incumbent's own point) is not run again: the earlier measurement is reused for the wave and
  listed in `spec["reused"]`. With `--repeats N` every point gets N fresh seeds instead.
- The incumbent is re-run inside the wave, first in the queue, when it has no run on the tier or
  its latest run is older than `[search] incumbent_max_age_waves` waves on that tier; those runs
  have source `remeasure` and are not candidates.
- Verdicts of members that finished before the incumbent had a figure are filled in by the
  controller when the incumbent's runs end (`analysis.refresh_pending`); reading a wave writes
  nothing.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nightlab import snapshots
from nightlab.analysis import ok_values
from nightlab.errors import DuplicateExperimentError, NightlabError, UsageError
from nightlab.ledger import Experiment, ExperimentStatus, SearchProgress, Wave

if TYPE_CHECKING:
    from nightlab.lab import Lab

__all__ = [
    "SnapshotFigure",
    "SubmittedWave",
    "WaveStatus",
    "default_plot_path",
    "head_files",
    "head_knobs",
    "noise",
    "noise_table",
    "parse_spaces",
    "promote",
    "promote_wave",
    "submit_incumbent",
    "submit_repeats",
    "submit_sweep",
    "submit_wave",
    "wave_effects",
    "wave_points",
    "wave_status",
]

CANDIDATE_SOURCES = ("sweep", "search", "promote")
REMEASURE = "remeasure"


@dataclass(frozen=True)
class SubmittedWave:
    """A wave just submitted: its ledger row, the experiments queued, and the reused measurements."""

    wave: Wave
    experiments: tuple[Experiment, ...]
    reused: dict[int, str] = field(default_factory=dict)  # design point index -> experiment id

    def to_dict(self) -> dict[str, Any]:
        return {
            "wave": self.wave.id,
            "design": self.wave.design,
            "tier": self.wave.tier,
            "experiments": [
                {"id": e.id, "seed": e.seed, "source": e.source, "params": e.params} for e in self.experiments
            ],
            "reused": {str(k): v for k, v in self.reused.items()},
        }


# --- the incumbent ---------------------------------------------------------------------------


def head_files(lab: Lab, rev: str = "HEAD") -> dict[str, bytes]:
    """The editable files of the incumbent (HEAD), or of an earlier one (commit `rev`), by name."""
    files = {}
    for name in lab.config.target.editable:
        try:
            files[name] = snapshots.read_file(lab.path, rev, name)
        except NightlabError:
            continue
    return files


def head_knobs(lab: Lab, rev: str = "HEAD") -> dict[str, Any]:
    """Knob name -> `Knob` over the editable files of the incumbent (or of commit `rev`)."""
    from nightlab.search.knobs import list_knobs

    out: dict[str, Any] = {}
    for content in head_files(lab, rev).values():
        try:
            text = content.decode()
        except UnicodeDecodeError:
            continue
        try:
            knobs = list_knobs(text)
        except UsageError:
            continue  # not Python (a shell script, a config): it has no knobs
        for knob in knobs:
            out.setdefault(knob.name, knob)
    return out


def parse_spaces(lab: Lab, specs: Sequence[str]) -> list[Any]:
    """Parse `NAME=...` specs and check each names a knob of the incumbent, of a fitting type.

    Raises:
        UsageError: no spec, a malformed spec (the accepted forms are listed), an unknown knob.
    """
    from nightlab.search.spaces import check_knobs, parse_space

    if not specs:
        raise UsageError("empty design: give at least one search space, e.g. `LR=log(0.01,0.08)`")
    dims = [parse_space(s) for s in specs]
    check_knobs(dims, list(head_knobs(lab).values()))
    return dims


def _incumbent_runs(lab: Lab, tier: str) -> list[Experiment]:
    """The incumbent's runs on `tier` that count: ok, or still queued or running."""
    return [
        e
        for e in lab.ledger.experiments(tree=lab.head_tree(), tier=tier)
        if e.ok or not e.status.is_finished()
    ]


def _incumbent_stale(lab: Lab, tier: str) -> bool:
    """Whether the incumbent has no run on `tier` or its latest is older than the allowed waves."""
    from nightlab.search.decide import incumbent_is_stale

    runs = _incumbent_runs(lab, tier)
    if not runs:
        return True
    latest = max(e.submitted_at for e in runs)
    age = sum(1 for w in lab.ledger.waves() if w.tier == tier and w.created_at > latest)
    return incumbent_is_stale(0, age, max_age_waves=lab.config.search.incumbent_max_age_waves)


def submit_incumbent(
    lab: Lab, tier: str, wave: str, n: int, files: Mapping[str, bytes] | None = None
) -> list[Experiment]:
    """Queue `n` runs of the incumbent on `tier` with unused seeds, ahead of the queue, in `wave`."""
    return lab.submit(
        "re-measure the incumbent",
        overrides=dict(head_files(lab) if files is None else files),
        tier=tier,
        repeats=n,
        fresh_seeds=True,
        wave=wave,
        priority=1,
        source=REMEASURE,
        start_controller=False,
    )


def submit_repeats(
    lab: Lab, experiment_id: str, *, tier: str, n: int, wave: str, source: str = "settle"
) -> list[Experiment]:
    """Queue `n` more runs of an experiment's snapshot on `tier`, with unused seeds, in `wave`."""
    exp = lab.ledger.get(experiment_id)
    files, base = lab.files_of(experiment_id)
    if n < 1:
        return []
    out = lab.submit(
        f"repeat {exp.id}: {exp.description}",
        overrides=dict(files),
        base=base,
        tier=tier,
        repeats=n,
        fresh_seeds=True,
        wave=wave,
        source=source,
        start_controller=False,
    )
    from nightlab.fleet.daemon import ensure_running

    ensure_running(lab.path)
    return out


# --- submitting ------------------------------------------------------------------------------


def _describe_run(description: str, run: Mapping[str, str]) -> str:
    return f"{description}: " + " ".join(f"{k}={v}" for k, v in run.items())


def _apply(files: Mapping[str, bytes], run: Mapping[str, str]) -> dict[str, bytes]:
    """The files with the run's knob values written in (each knob in the file that defines it).

    Raises:
        UsageError: a knob no file defines, or a value that is not a literal.
    """
    from nightlab.search.knobs import list_knobs, set_knobs

    out = dict(files)
    left = dict(run)
    for name, content in files.items():
        try:
            text = content.decode()
            mine = {k: v for k, v in left.items() if any(kn.name == k for kn in list_knobs(text))}
        except (UnicodeDecodeError, UsageError):
            continue
        if mine:
            out[name] = set_knobs(text, mine).encode()
            left = {k: v for k, v in left.items() if k not in mine}
    if left:
        raise UsageError(f"unknown knob `{next(iter(left))}`; list the knobs with `nightlab knobs`")
    return out


def _measured_point(lab: Lab, run: Mapping[str, str], files: Mapping[str, bytes], tier: str) -> Experiment:
    """The earlier measurement (seed 0) of a design point whose submit was refused as a duplicate."""
    overrides = _apply(files, run)
    commit, _, _ = snapshots.create_snapshot(
        lab.path, lab.config.target.editable, overrides=overrides, message="probe", base="HEAD"
    )
    from nightlab import identity

    tree = identity.of(lab.path, commit, config=lab.config)  # the key `submit` stored
    prior = lab.ledger.find_measured(tree, tier, 0)
    if prior is None:  # it vanished between the two reads (cancelled): nothing to reuse
        raise NightlabError("a design point changed while the wave was submitted; submit the wave again")
    return prior


def submit_wave(
    lab: Lab,
    runs: Sequence[Mapping[str, str]],
    *,
    design: str,
    description: str,
    tier: str | None = None,
    repeats: int = 1,
    spec: Mapping[str, Any] | None = None,
    source: str = "sweep",
    priority: int = 0,
    start_controller: bool = True,
    search: tuple[Mapping[str, Any], int] | None = None,
) -> SubmittedWave:
    """Record a wave and queue each run (knob -> source text) on top of the incumbent.

    Args:
        runs: the design points; each is applied to HEAD's editable files. A point listed n
            times runs n times as many seeds.
        design: the wave's kind as the ledger shows it (`full`, `optuna`, `search:greedy`, ...).
        repeats: runs per point, each with its own seed.
        spec: extra data kept in the wave's spec (spaces, design).
        source: the experiments' source (`sweep`, `search`).
        search: (the search's key, the wave's index) for a wave of `nightlab search`: its
            `SearchProgress` record is created with the wave.

    Returns:
        The wave, the experiments queued and the points that reused an earlier measurement.

    Raises:
        UsageError: no runs, an unknown tier, a bad knob value.
    """
    if not runs:
        raise UsageError("empty design: the wave has no runs; give at least one search space")
    if repeats < 1:
        raise UsageError(f"`--repeats` must be at least 1, got `{repeats}`")
    tier = lab.check_tier(tier or lab.config.fleet.default_tier)
    files = head_files(lab)
    for run in runs:  # a bad point fails here, before the wave is recorded
        _apply(files, run)
    base = lab.head()
    full_spec = {**(spec or {}), "runs": [dict(r) for r in runs], "repeats": repeats}
    wave = lab.ledger.add_wave(
        design=design, description=description, spec=full_spec, tier=tier, base_snapshot=base, search=search
    )
    queued: list[Experiment] = []
    if _incumbent_stale(lab, tier):
        queued += submit_incumbent(lab, tier, wave.id, 1, files)
    reused: dict[int, str] = {}
    # A point listed n times is one snapshot with n seeds (strategies ask for replicated points so).
    counts: dict[tuple, int] = {}
    first: dict[tuple, int] = {}
    for i, run in enumerate(runs):
        key = tuple(sorted(run.items()))
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, i)
    for key, i in first.items():
        run = runs[i]
        try:
            queued += lab.submit(
                _describe_run(description, run),
                sets=dict(run),
                overrides=dict(files),
                tier=tier,
                repeats=repeats * counts[key],
                wave=wave.id,
                priority=priority,
                source=source,
                start_controller=False,
            )
        except DuplicateExperimentError:
            reused[i] = _measured_point(lab, run, files, tier).id
    if reused:
        full_spec["reused"] = {str(i): eid for i, eid in reused.items()}
        lab.ledger.update_wave_spec(wave.id, full_spec)
    if start_controller and queued:
        from nightlab.fleet.daemon import ensure_running

        ensure_running(lab.path)
    return SubmittedWave(lab.ledger.wave(wave.id), tuple(queued), reused)


def _history(lab: Lab, spaces: list[str], design: str) -> list[Any]:
    """Observations of earlier waves of `design` over exactly these spaces (for Optuna)."""
    from nightlab.search.strategies import Observation

    metric = lab.config.metric.name
    out = []
    index = 0
    for w in lab.ledger.waves():
        if w.design != design or w.spec.get("spaces") != spaces:
            continue
        for e in lab.ledger.experiments(wave=w.id):
            if e.source in CANDIDATE_SOURCES and e.status == ExperimentStatus.FINISHED:
                out.append(Observation(e.id, dict(e.params), e.metric(metric) if e.ok else None, index))
        index += 1
    return out


def submit_sweep(
    lab: Lab,
    specs: Sequence[str],
    *,
    design: str = "full",
    description: str | None = None,
    repeats: int = 1,
    tier: str | None = None,
    size: int | None = None,
    resolution: int | None = None,
    levels: int = 2,
    sampler: str = "tpe",
    seed: int = 0,
    start_controller: bool = True,
) -> SubmittedWave:
    """`nightlab sweep`: one wave over the search spaces, around the incumbent.

    Args:
        design: `full`, `fractional`, `random` or `optuna`.
        size: runs of a random or Optuna wave (default 8).
        resolution: least resolution of a fractional design (None: chosen).
        levels: values per range in a full design.
        sampler: `tpe` or `gp` for `optuna`; earlier Optuna waves over the same spaces are told
            to the sampler first.

    Raises:
        UsageError: a malformed or unknown space, an empty or impossible design, a bad tier.
    """
    from nightlab.search.designs import make_design

    dims = parse_spaces(lab, specs)
    spaces = [d.spec() for d in dims]
    description = description or f"{design} sweep over {', '.join(d.name for d in dims)}"
    spec: dict[str, Any] = {"spaces": spaces}
    if design == "optuna":
        from nightlab.search.strategies import OptunaStrategy

        history = _history(lab, spaces, "optuna")
        # A fresh study replays the history, but its random start-up draws follow the seed alone:
        # shift the seed by the history so a second batch does not draw the first one again.
        strategy = OptunaStrategy(
            dims, lower_is_better=lab.config.metric.lower_is_better, seed=seed + len(history), sampler=sampler
        )
        knobs = head_knobs(lab)
        incumbent = {d.name: knobs[d.name].source for d in dims}
        runs = strategy.propose(incumbent, history, size or 8)
        if not runs:
            raise UsageError("Optuna found no new point in these spaces; widen them or use more knobs")
        spec["sampler"] = sampler
    else:
        made = make_design(design, dims, size=size or 8, resolution=resolution, seed=seed, levels=levels)
        runs = list(made.runs)
        spec["design"] = made.to_dict()
    return submit_wave(
        lab,
        runs,
        design=design,
        description=description,
        tier=tier,
        repeats=repeats,
        spec=spec,
        start_controller=start_controller,
    )


def noise(
    lab: Lab, *, repeats: int = 3, tier: str | None = None, start_controller: bool = True
) -> SubmittedWave:
    """`nightlab noise`: re-run the incumbent `repeats` times with unused seeds, as a `noise` wave.

    Raises:
        UsageError: fewer than 2 repeats or an unknown tier.
    """
    if repeats < 2:
        raise UsageError(f"a noise floor needs at least 2 runs, got `--repeats {repeats}`")
    tier = lab.check_tier(tier or lab.config.fleet.default_tier)
    wave = lab.ledger.add_wave(
        design="noise",
        description=f"noise floor: {repeats} runs of the incumbent",
        spec={"repeats": repeats},
        tier=tier,
        base_snapshot=lab.head(),
    )
    queued = lab.submit(
        "noise floor: re-run the incumbent",
        overrides=head_files(lab),
        tier=tier,
        repeats=repeats,
        wave=wave.id,
        source="noise",
        start_controller=start_controller,
    )
    return SubmittedWave(wave, tuple(queued))


def promote(
    lab: Lab,
    ids: Sequence[str],
    *,
    tier: str,
    repeats: int = 2,
    description: str | None = None,
    screen: Mapping[str, float] | None = None,
    start_controller: bool = True,
) -> SubmittedWave:
    """`nightlab promote`: re-run the snapshots of `ids` on `tier` with `repeats` seeds each.

    The incumbent gets runs on `tier` too when it has fewer than `repeats` there (or they are
    stale), so the candidates can be judged on that tier.

    Raises:
        UsageError: no ids, a tier without workers (the existing tiers are named), an id already
            on that tier.
    """
    if not ids:
        raise UsageError("name the experiments to promote, e.g. `nightlab promote e0007 --tier h200`")
    tier = lab.check_tier(tier)
    sources = [lab.ledger.get(i) for i in ids]
    for e in sources:
        if e.tier == tier:
            raise UsageError(
                f"{e.id} already ran on tier `{tier}`; promote to another tier, or repeat it with "
                f"`nightlab submit --from {e.id} --repeats {repeats}`"
            )
    metric = lab.config.metric.name
    if screen is None:
        screen = {}
        for e in sources:
            values = ok_values(lab.ledger.experiments(tree=e.tree, tier=e.tier), metric)
            if values:
                screen[e.id] = statistics.fmean(values)
    wave = lab.ledger.add_wave(
        design="promote",
        description=description or f"promote {', '.join(ids)} to {tier}",
        spec={"promoted": {}, "screen": dict(screen), "screen_tiers": {e.id: e.tier for e in sources}},
        tier=tier,
        base_snapshot=lab.head(),
    )
    queued: list[Experiment] = []
    incumbent = _incumbent_runs(lab, tier)
    if _incumbent_stale(lab, tier) or len(incumbent) < repeats:
        queued += submit_incumbent(lab, tier, wave.id, max(1, repeats - len(incumbent)), head_files(lab))
    promoted: dict[str, list[str]] = {}
    for e in sources:
        files, base = lab.files_of(e.id)
        exps = lab.submit(
            f"promote {e.id}: {e.description}",
            overrides=dict(files),
            base=base,
            tier=tier,
            repeats=repeats,
            fresh_seeds=True,
            wave=wave.id,
            source="promote",
            start_controller=False,
        )
        promoted[e.id] = [x.id for x in exps]
        queued += exps
    spec = {**wave.spec, "promoted": promoted}
    lab.ledger.update_wave_spec(wave.id, spec)
    if start_controller and queued:
        from nightlab.fleet.daemon import ensure_running

        ensure_running(lab.path)
    return SubmittedWave(lab.ledger.wave(wave.id), tuple(queued))


def promote_wave(
    lab: Lab,
    wave_id: str,
    *,
    tier: str,
    repeats: int = 2,
    top_k: int | None = None,
    start_controller: bool = True,
) -> SubmittedWave:
    """Screen-and-promote: promote the top k candidates of a screened wave that beat the incumbent.

    Candidates qualify with verdict `keep` or `within-noise` on the wave's tier; the best `k`
    (`[search] promote_top_k`) by mean go to `tier` with `repeats` runs each.

    Raises:
        UsageError: the wave is still running, or none of its candidates beat the incumbent.
    """
    from nightlab.search.decide import promote as pick

    status = wave_status(lab, wave_id)
    if status.pending:
        raise UsageError(
            f"wave `{wave_id}` has {status.pending} runs still pending; wait for it first "
            f"(`nightlab wait {' '.join(e.id for e in status.runs if not e.status.is_finished())}`)"
        )
    metric = lab.config.metric.name
    by_tree: dict[str, list[Experiment]] = {}
    for e in status.candidates:
        if e.ok and e.verdict in ("keep", "within-noise"):
            by_tree.setdefault(e.tree, []).append(e)
    means = {
        runs[0].id: statistics.fmean(v for r in runs if (v := r.metric(metric)) is not None)
        for runs in by_tree.values()
    }
    if not means:
        raise UsageError(
            f"no candidate of wave `{wave_id}` beat the incumbent on tier `{status.wave.tier}`; nothing to promote"
        )
    k = top_k if top_k is not None else lab.config.search.promote_top_k
    chosen = pick(means, k, lower_is_better=lab.config.metric.lower_is_better)
    return promote(
        lab,
        chosen,
        tier=tier,
        repeats=repeats,
        description=f"promote top {len(chosen)} of {wave_id} to {tier}",
        screen={i: means[i] for i in chosen},
        start_controller=start_controller,
    )


# --- reading ---------------------------------------------------------------------------------


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
        return tuple(e for e in self.runs if e.source != REMEASURE and e.source != "noise")

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
    return [
        (e, reused.get(e.id, dict(e.params)))
        for e in wave_runs(lab, wave)
        if e.id in reused or (e.wave == wave.id and e.source in CANDIDATE_SOURCES)
    ]


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
        values = ok_values(lab.ledger.experiments(tree=mine[0].tree, tier=wave.tier), metric)
        if values:
            validation[origin] = statistics.fmean(values)
        verdicts[origin] = next((e.verdict for e in mine if e.verdict is not None), None)
    return {
        "screen": screen,
        "validation": validation,
        "verdicts": verdicts,
        "kept": [i for i, v in verdicts.items() if v == "keep"],
        "rank_correlation": spearman(screen, validation),
    }


def wave_status(lab: Lab, wave_id: str) -> WaveStatus:
    """The wave's runs with refreshed verdicts, its best candidate and, for promotions, the tier report.

    Raises:
        UnknownExperimentError: no such wave (exit 2).
    """
    from nightlab.analysis import incumbent_figure

    wave = lab.ledger.wave(wave_id)
    runs = wave_runs(lab, wave)
    incumbent = incumbent_figure(lab.ledger, lab.config, lab.path, wave.tier) if wave.tier else None
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

    tree: str
    tier: str
    mean: float
    std: float
    n: int
    experiments: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def noise_table(
    lab: Lab, tier: str | None = None
) -> tuple[list[SnapshotFigure], dict[str, tuple[float | None, int]]]:
    """Every snapshot with repeats, per tier, and each tier's pooled noise floor (sigma, dof)."""
    from nightlab.analysis import noise_sigma

    metric = lab.config.metric.name
    groups: dict[tuple[str, str], list[Experiment]] = {}
    for e in lab.ledger.experiments(status=ExperimentStatus.FINISHED, tier=tier):
        if e.ok and e.metric(metric) is not None:
            groups.setdefault((e.tree, e.tier), []).append(e)
    figures = []
    for (tree, t), exps in groups.items():
        if len(exps) > 1:
            values = [e.metric(metric) for e in exps]
            figures.append(
                SnapshotFigure(
                    tree,
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
