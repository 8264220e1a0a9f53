"""Submitting waves: sweeps, noise-floor runs, the incumbent's re-measurements and repeats.

A wave is built around the incumbent: the files of HEAD (`Lab.files_at`), not the working tree,
and knob values go in by `lab.apply_sets`, the rule `nightlab submit --set` uses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nightlab import snapshots
from nightlab.errors import DuplicateExperimentError, NightlabError, UsageError
from nightlab.lab import apply_sets
from nightlab.ledger import Experiment, ExperimentStatus, Source, Wave

if TYPE_CHECKING:
    from nightlab.lab import Lab


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


def head_knobs(lab: Lab, rev: str = "HEAD") -> dict[str, Any]:
    """Knob name -> `Knob` over the editable files of the incumbent (or of commit `rev`)."""
    from nightlab.search.knobs import list_knobs

    out: dict[str, Any] = {}
    for content in lab.files_at(rev).values():
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


def _incumbent_runs(lab: Lab, tier: str, head_identity: str) -> list[Experiment]:
    """The incumbent's runs on `tier` that count: ok, or still queued or running."""
    return [
        e
        for e in lab.ledger.experiments(identity=head_identity, tier=tier)
        if e.ok or not e.status.is_finished()
    ]


def _incumbent_stale(lab: Lab, tier: str, head_identity: str) -> bool:
    """Whether the incumbent has no run on `tier` or its latest is older than the allowed waves."""
    from nightlab.search.decide import incumbent_is_stale

    runs = _incumbent_runs(lab, tier, head_identity)
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
        overrides=dict(lab.files_at() if files is None else files),
        tier=tier,
        repeats=n,
        fresh_seeds=True,
        wave=wave,
        priority=1,
        source=Source.REMEASURE,
        start_controller=False,
    )


def submit_repeats(
    lab: Lab, experiment_id: str, *, tier: str, n: int, wave: str, source: Source = Source.SETTLE
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


def _measured_point(lab: Lab, run: Mapping[str, str], files: Mapping[str, bytes], tier: str) -> Experiment:
    """The earlier measurement (seed 0) of a design point whose submit was refused as a duplicate."""
    overrides = apply_sets(files, run)
    commit, _, _ = snapshots.create_snapshot(
        lab.path, lab.config.target.editable, overrides=overrides, message="probe", base="HEAD"
    )
    from nightlab import identity

    ident = identity.of(lab.path, commit, config=lab.config)  # the key `submit` stored
    prior = lab.ledger.find_measured(ident, tier, 0)
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
    source: Source = Source.SWEEP,
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
    inc = lab.incumbent()
    files = lab.files_at(inc.commit)
    for run in runs:  # a bad point fails here, before the wave is recorded
        apply_sets(files, run)
    base = inc.commit
    full_spec = {**(spec or {}), "runs": [dict(r) for r in runs], "repeats": repeats}
    wave = lab.ledger.add_wave(
        design=design, description=description, spec=full_spec, tier=tier, base_snapshot=base, search=search
    )
    queued: list[Experiment] = []
    if _incumbent_stale(lab, tier, inc.identity):
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
            if e.source.is_candidate and e.status == ExperimentStatus.FINISHED:
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
        overrides=lab.files_at(),
        tier=tier,
        repeats=repeats,
        wave=wave.id,
        source=Source.NOISE,
        start_controller=start_controller,
    )
    return SubmittedWave(wave, tuple(queued))
