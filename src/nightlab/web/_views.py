"""The data of each dashboard page, as plain JSON-ready dicts.

Every figure comes from the function the CLI uses for the same figure, so a page and
`nightlab ... --json` can never disagree on one ledger:

- incumbent and baseline figures, leaderboard rows, deltas, verdicts:
  `views.results_payload` over `analysis.ranking` (= `nightlab results --json`);
- controller, workers, running and queued experiments, fleet efficiency:
  `views.fleet_state` (= `nightlab status --json`);
- diff and log tail: `snapshots.diff` and `fleet.runner.read_tail` / `clean_lines`
  (as `nightlab show --json`);
- wave effects: `waves.wave_effects` + `views.effects_payload` (= `nightlab effects --json`).

Only what no CLI command reports is computed here: the live loss parsed from a running
log (`_live`), repeats / promotions / children of an experiment, and the chart series.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from nightlab.errors import NightlabError
from nightlab.ledger import Experiment, ExperimentStatus
from nightlab.rungs import tier_label
from nightlab.web._live import log_progress
from nightlab.web._readonly import ReadOnlyLab

LEADERBOARD_ROWS = 25
RECENT_CRASHES = 10
DESCRIPTION_CHARS = 160  # what the chart's hover shows; the experiment page has the whole text


def finite(value: Any) -> Any:
    """The value with every NaN / infinity replaced by None (browsers' JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def _ranking(lab: ReadOnlyLab) -> tuple[list[Any], dict[str, Any]]:
    from nightlab.analysis import ranking

    return ranking(lab.ledger, lab.config, lab.path)


class VersionCache:
    """Computed page data, reused while the lab's version is unchanged.

    `results_json` reads every experiment and metric (about 0.6 s of CPU at 20,000 experiments
    on a 2-core box); `ranking` only a few columns of each (what the overview needs). The
    version (latest event id + HEAD) moves with every submit, start, end, verdict and adoption,
    so a cached value is never stale. Safe to share between threads.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[str, Any]] = {}
        self._flights: dict[str, threading.Lock] = {}

    def get(self, lab: ReadOnlyLab, name: str, compute: Callable[[ReadOnlyLab], Any]) -> Any:
        version = lab.version()
        with self._lock:
            hit = self._entries.get(name)
            flight = self._flights.setdefault(name, threading.Lock())
        if hit is not None and hit[0] == version:
            return hit[1]
        # one computation per name at a time: the page poll and the chart fetch that follow a
        # change would otherwise both read the whole ledger (on 2 cores, twice as slow each)
        with flight:
            with self._lock:
                hit = self._entries.get(name)
            if hit is not None and hit[0] == version:
                return hit[1]
            # computed after reading the version: a change in between only costs a recompute later
            value = compute(lab)
            with self._lock:
                self._entries[name] = (version, value)
        return value

    def ranking(self, lab: ReadOnlyLab) -> tuple[list[Any], dict[str, Any]]:
        """`analysis.ranking`: every experiment ranked, no row decoded, and the incumbents."""
        return self.get(lab, "ranking", _ranking)

    def results_json(self, lab: ReadOnlyLab) -> str:
        """`nightlab results --json`, encoded (every experiment: 11 MB at 20,000)."""

        def compute(lab: ReadOnlyLab) -> str:
            from nightlab.views import every_result_payload
            from nightlab.views.encode import json_text

            return json_text(every_result_payload(lab))

        return self.get(lab, "results-json", compute)


def _fleet_state(lab: ReadOnlyLab) -> dict[str, Any]:
    from nightlab.views import fleet_state

    return fleet_state(lab)


def counts(states: Iterable[tuple[str, str | None]]) -> dict[str, int]:
    """done / ok / crashed / invalid / running / queued / cancelled, from (status label, outcome) pairs."""
    out = dict.fromkeys(("done", "ok", "crashed", "invalid", "degraded", "running", "queued", "cancelled"), 0)
    for status, outcome in states:
        if status == "finished":
            out["done"] += 1
            kind = outcome if outcome in ("ok", "invalid", "degraded") else "crashed"
            out[kind] += 1
        elif status in out:
            out[status] += 1
    return out


def noise_floors(lab: ReadOnlyLab, ranked: list[Any]) -> dict[str, dict[str, Any]]:
    """Per tier: the noise floor every verdict there used (sd of one run, its degrees of freedom,
    the repeated runs it pools), as `nightlab noise --show` has it; sigma None when unmeasured.

    Pooled from the ranked keys (no row decoded), in the comparison epoch in force, by the same
    rule as `Judge.floor`.
    """
    from nightlab.analysis import repeat_groups
    from nightlab.identity import epoch_key
    from nightlab.search.decide import pooled_sd

    metric, epoch = lab.config.metric.name, epoch_key(lab.config)
    by_tier: dict[str, list[Any]] = {}
    for r in ranked:
        by_tier.setdefault(r.key.tier, []).append(r.key)
    out = {}
    for tier, keys in by_tier.items():
        groups = repeat_groups(keys, metric, epoch)
        sigma, dof = pooled_sd(groups)
        out[tier] = {"sigma": sigma, "dof": dof, "runs": sum(len(g) for g in groups if len(g) > 1)}
    return out


def tier_summaries(
    payload: dict[str, Any], floors: dict[str, dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Per tier: the incumbent's and the baseline's figure, the improvement between them, and the
    noise floor (`noise_floors`) that says how sure a verdict there can be."""
    out = []
    floors = floors or {}
    baseline = payload.get("baseline", {}).get("tiers", {})
    for tier, inc in payload["incumbent"]["tiers"].items():
        base = baseline.get(tier)
        improvement = relative = None
        if inc and base:
            improvement = inc["mean"] - base["mean"]
            relative = improvement / base["mean"] if base["mean"] else None
        out.append(
            {
                "tier": tier,
                "incumbent": inc,
                "baseline": base,
                "improvement": improvement,
                "relative": relative,
                "noise": floors.get(tier, {"sigma": None, "dof": 0, "runs": 0}),
            }
        )
    return out


def _overview_results(lab: ReadOnlyLab, cache: VersionCache) -> dict[str, Any]:
    """The overview's figures from the ranking: only its leaderboard and crash rows are decoded."""
    from nightlab.analysis import result_rows
    from nightlab.identity import epoch_line
    from nightlab.views import result_row, results_payload

    ranked, incumbents = cache.ranking(lab)
    payload = results_payload(lab, ranked, incumbents, [])
    leaders = [r for r in ranked if r.value is not None][:LEADERBOARD_ROWS]
    crashes = sorted(
        (
            r
            for r in ranked
            if r.key.status == ExperimentStatus.FINISHED
            and r.key.outcome not in ("ok", "invalid", "degraded")
        ),
        key=lambda r: r.key.finished_at or 0,
        reverse=True,
    )[:RECENT_CRASHES]
    from nightlab.rungs import screening_waves

    waves = screening_waves(lab)
    rows = {
        row.experiment.id: result_row(lab, row, waves) for row in result_rows(lab.ledger, leaders + crashes)
    }
    return finite(
        {
            "metric": payload["metric"],
            "direction": payload["direction"],
            "incumbent_commit": payload["incumbent"]["commit"],
            "epoch": payload["epoch"],
            "epoch_line": epoch_line(payload["epoch"]),
            "tiers": tier_summaries(payload, noise_floors(lab, ranked)),
            "counts": counts((r.key.status.label, r.key.outcome) for r in ranked),
            "leaderboard": [rows[r.key.id] for r in leaders if r.key.id in rows],
            "recent_crashes": [rows[r.key.id] for r in crashes if r.key.id in rows],
        }
    )


def overview(lab: ReadOnlyLab, cache: VersionCache | None = None) -> dict[str, Any]:
    """Incumbent and improvement per tier, counts, fleet efficiency, leaderboard, recent crashes."""
    from nightlab.analysis import fleet_efficiency
    from nightlab.views import controller_state

    cache = cache or VersionCache()
    data = dict(cache.get(lab, "overview", lambda lab: _overview_results(lab, cache)))
    # these move without an event (heartbeats, a controller dying): read them every time
    efficiency = fleet_efficiency(lab.ledger)
    data["efficiency"] = finite(efficiency.__dict__) if efficiency else None
    data["controller"] = controller_state(lab)
    data["version"] = lab.version()
    return data


def progress_series(lab: ReadOnlyLab, cache: VersionCache | None = None) -> dict[str, Any]:
    """Every ok experiment as a point in time order, and each tier's incumbent line.

    Kept means what `report.progress_png` highlights (`report.tsv_status` == keep); the line is the
    best figure (mean of its runs, `report.kept_snapshots`) of the snapshots kept so far, as in
    progress.png.
    """
    cache = cache or VersionCache()
    return cache.get(lab, "progress", lambda lab: _progress_series(lab, cache))


def _progress_series(lab: ReadOnlyLab, cache: VersionCache) -> dict[str, Any]:
    from nightlab.report import adopted_identities, kept_snapshots, tsv_status

    ranked, _ = cache.ranking(lab)  # the keys carry what a point needs: no row decoded
    exps = [r.key for r in ranked]
    metric = lab.config.metric.name
    better = min if lab.config.metric.lower_is_better else max
    points = sorted(
        (
            (e.finished_at, e)
            for e in exps
            if e.ok and e.finished_at is not None and e.metric(metric) is not None
        ),
        key=lambda p: (p[0], p[1].seq),
    )
    adopted = adopted_identities(exps)
    figures = {
        entry.id: mean
        for entry, mean in kept_snapshots((e for _, e in points if tsv_status(e, adopted) == "keep"), metric)
    }
    best: dict[str, float] = {}
    out = []
    for t, e in points:
        value = e.metric(metric)
        kept = tsv_status(e, adopted) == "keep"
        if e.id in figures:
            figure = figures[e.id]
            best[e.tier] = figure if e.tier not in best else better(best[e.tier], figure)
        out.append(
            {
                "id": e.id,
                "t": t,
                "y": value,
                "tier": e.tier,
                "kept": kept,
                "verdict": None if e.verdict is None else str(e.verdict),
                "best": best.get(e.tier),
                "description": e.description[:DESCRIPTION_CHARS],
            }
        )
    return {
        "metric": metric,
        "direction": lab.config.metric.direction,
        "tiers": sorted({p["tier"] for p in out}),
        "points": finite(out),
        "version": lab.version(),
    }


def _gpu(info: dict[str, Any], cluster: dict[str, Any] | None) -> str | None:
    """What the worker runs on: a remote cluster's GPU name, the pool's accelerators, a local GPU index."""
    if cluster and cluster.get("gpu_name"):
        lane = info.get("gpu") if info.get("cluster") else None  # one GPU of a multi-GPU node
        return str(cluster["gpu_name"]) + (f" (GPU {lane})" if lane is not None else "")
    if isinstance(info.get("gpu"), int):
        return f"cuda:{info['gpu']}"  # a local slot: the index in CUDA_VISIBLE_DEVICES terms
    for key in ("gpu_name", "accelerators", "accelerator", "gpus"):
        value = info.get(key)
        if value not in (None, "", [], ()):
            return ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return None


def _budget_seconds(lab: ReadOnlyLab, tier: str | None = None) -> tuple[float, str]:
    """A run's training budget (its tier's: a screening rung has its own), else the hard timeout."""
    from nightlab.rungs import budget_of, full_budget

    budget = budget_of(lab.config, tier) if tier is not None else full_budget(lab.config)
    if budget is not None and budget > 0:
        return float(budget), "budget"
    return float(lab.config.target.timeout), "timeout"


def fleet(lab: ReadOnlyLab) -> dict[str, Any]:
    """One row per worker with its running experiment, elapsed time, progress and live loss."""
    state = _fleet_state(lab)
    running = {r["worker"]: r for r in state["running"] if r["worker"]}
    clusters = {k["worker"]: k for k in state.get("clusters") or []}  # SkyPilot workers, when any
    budget, budget_kind = _budget_seconds(lab)
    rows = []
    for w in state["workers"]:
        run = running.get(w["name"])
        live = progress = source = None
        if run is not None:
            attempts = lab.ledger.attempts(run["id"])
            live = log_progress(attempts[-1].log_path if attempts else None)
            if live.percent is not None:
                progress, source = live.percent / 100, "log"
            elif run["elapsed"] is not None:
                tier_budget, budget_kind = _budget_seconds(lab, w["tier"])
                progress, source = min(run["elapsed"] / tier_budget, 1.0), budget_kind
        rows.append(
            {
                "name": w["name"],
                "tier": w["tier"],
                "rung": tier_label(lab.config, w["tier"]),
                "backend": w["backend"],
                "gpu": _gpu(w["info"], clusters.get(w["name"]) or clusters.get(w["info"].get("cluster", ""))),
                "state": w["state"],
                "experiment": run,
                "progress": progress,
                "progress_source": source,
                "loss": live.loss if live else None,
                "loss_line": live.line if live else None,
            }
        )
    return finite(
        {
            "controller": state["controller"],
            "efficiency": state["efficiency"],
            "workers": rows,
            "running": state["running"],
            "queued": state["queued"],
            "budget_seconds": budget,
            "budget_kind": budget_kind,
            "now": time.time(),
        }
    )


def _commit_identities(lab: ReadOnlyLab) -> dict[str, str]:
    """commit -> research identity for every commit on the lab's branch (where adopted snapshots land)."""
    from nightlab import identity, snapshots

    out = {}
    for commit in snapshots.git_text(lab.path, "log", "--format=%H", "HEAD").splitlines():
        try:
            out[commit] = identity.of(lab.path, commit)  # cached per commit: a commit never changes
        except NightlabError:
            continue  # a commit from before the lab had a nightlab.toml
    return out


def experiment(lab: ReadOnlyLab, experiment_id: str, *, tail_lines: int = 60) -> dict[str, Any]:
    """One experiment as `nightlab show --json` has it, plus its relatives and live progress.

    Raises:
        UnknownExperimentError: no such experiment.
    """
    from nightlab.views import show_payload

    data = show_payload(lab, experiment_id, tail_lines=tail_lines)
    e = lab.ledger.get(experiment_id)

    # relatives by indexed or targeted queries: a full scan costs ~0.2 s at 5,000 experiments
    line = _commit_identities(lab)
    same = [x for x in lab.ledger.experiments(identity=e.identity, with_metrics=False) if x.id != e.id]
    parent_exp = parent_identity = None
    if e.parent:
        by_snapshot = lab.ledger.by_commit("snapshot", [e.parent])
        parent_exp = by_snapshot[0] if by_snapshot else None
        parent_identity = line.get(e.parent) or (parent_exp.identity if parent_exp else None)
        if parent_exp is None and parent_identity is not None:
            # a commit on the lab's branch: the experiment whose files it holds (adopted first)
            holders = [
                x
                for x in lab.ledger.experiments(identity=parent_identity, with_metrics=False)
                if x.id != e.id
            ]
            parent_exp = min(holders, key=lambda x: (x.adopted_at is None, x.seq), default=None)
    # children were derived from a commit holding these files: a run's snapshot or an adoption
    holding = {e.snapshot, *(x.snapshot for x in same), *(c for c, t in line.items() if t == e.identity)}
    children = [x for x in lab.ledger.by_commit("parent", holding) if x.id != e.id]

    def brief(x: Experiment) -> dict[str, Any]:
        return {
            "id": x.id,
            "tier": x.tier,
            "seed": x.seed,
            "status": x.status.label,
            "outcome": x.outcome,
            "verdict": x.verdict,
            "description": x.description,
        }

    data["related"] = {
        "parent_commit": e.parent,
        "parent": brief(parent_exp) if parent_exp else None,
        "parent_on_branch": e.parent in line if e.parent else False,
        "repeats": [brief(x) for x in same if x.tier == e.tier],
        "promotions": [brief(x) for x in same if x.tier != e.tier],
        "children": [brief(x) for x in children],
    }
    data["metric"] = lab.config.metric.name
    data["live"] = None
    if e.status == ExperimentStatus.RUNNING and data["log_path"]:
        live = log_progress(data["log_path"])
        data["live"] = {"loss": live.loss, "percent": live.percent, "line": live.line}
    return finite(data)


def wave_effects(lab: ReadOnlyLab, wave_id: str) -> dict[str, Any]:
    """`nightlab effects WAVE --json`, without the PNG the CLI writes (`plot` is None).

    A wave without search spaces (noise, promotion) has no factors: then only `message` is set,
    with the CLI's reason.
    """
    from nightlab.errors import UsageError
    from nightlab.views import effects_payload
    from nightlab.waves import wave_effects as fit

    try:
        result, values = fit(lab, wave_id)
    except UsageError as e:
        return {"message": str(e), "terms": [], "intercept": None}
    return finite(effects_payload(result, values, lab.config.metric.name, None))


def waves(lab: ReadOnlyLab) -> dict[str, Any]:
    """Every wave with its design and the state of its experiments."""
    exps = lab.ledger.experiments(with_metrics=False)
    by_wave: dict[str, list[Experiment]] = {}
    for e in exps:
        if e.wave:
            by_wave.setdefault(e.wave, []).append(e)
    out = []
    for w in lab.ledger.waves():
        mine = by_wave.get(w.id, [])
        out.append(
            {
                **w.to_dict(),
                "counts": counts((e.status.label, e.outcome) for e in mine),
            }
        )
    return finite({"waves": out[::-1], "version": lab.version()})


def wave(lab: ReadOnlyLab, wave_id: str) -> dict[str, Any]:
    """One wave: design, every experiment with its knob values and metric, and the effects.

    Raises:
        UnknownExperimentError: no such wave.
    """
    w = lab.ledger.wave(wave_id)
    from nightlab.waves import wave_runs

    reused = set(w.spec.get("reused", {}).values()) if isinstance(w.spec.get("reused"), dict) else set()
    metric = lab.config.metric.name
    rows = [{**e.brief(metric), "reused": e.id in reused} for e in wave_runs(lab, w)]
    return finite(
        {
            **w.to_dict(),
            "metric": metric,
            "counts": counts((r["status"], r["outcome"]) for r in rows),
            "experiments": rows,
            "effects": wave_effects(lab, w.id),
            "version": lab.version(),
        }
    )


def agent(lab: ReadOnlyLab) -> dict[str, Any]:
    """The supervisor's state and transcript tail (`present` False when no agent ran)."""
    from nightlab.web._agent import agent_state

    return finite(agent_state(lab.path))
