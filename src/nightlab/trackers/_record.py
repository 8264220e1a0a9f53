"""What a tracker is sent of an experiment: one `RunRecord`, the same for W&B and MLflow.

Built from the ledger alone (plus the snapshot's files in git and the attempt's log), so live
logging and `nightlab export` send the same thing, and its `digest` says whether a destination
already holds it:

    config   the knobs as set in the snapshot (every UPPERCASE constant of its editable .py
             files, `--set` values included), snapshot commit, parent, tier, budget, timeout,
             seed, profile, epoch, source, wave, the proposer
    metrics  every numeric, finite summary key, and the machine health's figures (`health.*`)
    tags     outcome (`crash:oom`, `timeout`, ...), verdict, trust mark, health, wave, proposer,
             status class (`ok`, `crash`, `timeout`, `invalid`, `degraded`, `infra`)
    files    diff.patch (against the parent) and log_tail.txt

The proposer is the search strategy (`search:pattern`) or design (`sweep:full`) of the run's
wave, `agent:<name>` for a `nightlab submit` made while an agent supervisor ran (the supervisor
counts its experiments the same way), else the source (`cli`, `noise`, `settle`, ...).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nightlab.config import LabConfig
from nightlab.ledger import AgentRun, BaseLedger, Experiment, Wave

LOG_TAIL_LINES = 200  # what the log_tail.txt file holds: enough for a traceback and the summary block


@dataclass(frozen=True)
class RunRecord:
    """One finished experiment as every tracker logs it (see the module docstring)."""

    experiment_id: str
    run_id: str  # `<lab id>-<experiment id>`: the W&B run id, the `nightlab.run` tag in MLflow
    name: str
    description: str
    wave: str | None
    config: dict[str, Any]
    metrics: dict[str, float]
    tags: dict[str, str]
    files: dict[str, str] = field(repr=False)
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def failed(self) -> bool:
        return self.tags["class"] != "ok"

    @property
    def digest(self) -> str:
        """A hash of everything sent: equal digests mean the destination already holds this."""
        data = {k: v for k, v in self.__dict__.items() if k != "files"}
        data["files"] = {k: hashlib.sha256(v.encode()).hexdigest() for k, v in self.files.items()}
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:20]


@dataclass(frozen=True)
class WaveRecord:
    """A wave as a tracker groups its runs: a W&B group, an MLflow parent run."""

    id: str
    run_id: str
    design: str
    description: str
    tier: str | None
    base_snapshot: str | None
    created_at: float


class LabView:
    """What building records needs of a lab, read once per batch: the lab id, waves, the agent run."""

    def __init__(self, lab_dir: Path, config: LabConfig, ledger: BaseLedger, lab_id: str) -> None:
        self.lab_dir, self.config, self.ledger, self.lab_id = Path(lab_dir), config, ledger, lab_id
        self.waves: dict[str, Wave] = {w.id: w for w in ledger.waves()}
        self.agent: AgentRun | None = ledger.agent_run()

    def wave(self, wave_id: str) -> WaveRecord:
        w = self.waves.get(wave_id) or self.ledger.wave(wave_id)
        return WaveRecord(
            w.id, f"{self.lab_id}-{w.id}", w.design, w.description, w.tier, w.base_snapshot, w.created_at
        )

    def proposer(self, e: Experiment) -> str:
        wave = self.waves.get(e.wave) if e.wave else None
        if wave is not None and e.source in ("search", "sweep", "promote"):
            return wave.design if ":" in wave.design else f"{e.source}:{wave.design}"
        a = self.agent
        during = a is not None and a.started_at <= e.submitted_at
        if (
            e.source == "cli"
            and a is not None
            and during
            and (a.status == "running" or e.submitted_at <= a.updated_at)
        ):
            return f"agent:{a.agent}"
        return str(e.source)

    def record(self, e: Experiment) -> RunRecord:
        """The record of a finished experiment."""
        from nightlab.judge import trust
        from nightlab.rungs import budget_of

        profile = self.config.profile or {}
        health = e.health or {}
        config: dict[str, Any] = {
            **_knobs(self.lab_dir, e.snapshot, self.config.target.editable),
            "experiment": e.id,
            "lab": self.lab_dir.name,
            "description": e.description,
            "snapshot": e.snapshot,
            "parent": e.parent,
            "tier": e.tier,
            # the run's rung: the harness's figure, else its tier's budget (`nightlab.rungs`)
            "budget_seconds": e.metrics.get("budget_seconds") or budget_of(self.config, e.tier),
            "timeout_seconds": self.config.target.timeout,
            "seed": e.seed,
            "profile": profile.get("name"),
            "epoch": e.epoch,
            "source": str(e.source),
            "wave": e.wave,
            "set": dict(e.params),
        }
        metrics = {k: float(v) for k, v in e.metrics.items() if _finite(v)}
        metrics.update({f"health.{k}": float(v) for k, v in health.items() if _finite(v)})
        outcome = str(e.outcome or "")
        tags = {
            "outcome": outcome,
            "class": outcome.split(":")[0] or "unknown",
            "verdict": str(e.verdict or "none"),
            "trust": trust(e, self.config),
            "health": "degraded" if e.degraded else ("ok" if health else "not sampled"),
            "wave": e.wave or "none",
            "proposer": self.proposer(e),
            "tier": e.tier,
            "adopted": "yes" if e.adopted_at is not None else "no",
        }
        if e.detail:
            tags["detail"] = e.detail[:500]
        return RunRecord(
            experiment_id=e.id,
            run_id=f"{self.lab_id}-{e.id}",
            name=e.id,
            description=e.description,
            wave=e.wave,
            config=config,
            metrics=metrics,
            tags=tags,
            files={"diff.patch": self._diff(e), "log_tail.txt": self._tail(e)},
            started_at=e.started_at,
            finished_at=e.finished_at,
        )

    def _diff(self, e: Experiment) -> str:
        from nightlab import snapshots
        from nightlab.errors import SnapshotError

        try:
            return snapshots.diff(self.lab_dir, e.parent, e.snapshot)
        except SnapshotError as err:
            return f"(diff unavailable: {err})\n"

    def _tail(self, e: Experiment) -> str:
        from nightlab.fleet.runner import clean_lines, read_tail

        paths = [a.log_path for a in self.ledger.attempts(e.id) if a.log_path]
        if not paths:
            return ""
        return "\n".join(clean_lines(read_tail(Path(paths[-1])))[-LOG_TAIL_LINES:]) + "\n"


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _knobs(lab_dir: Path, commit: str, editable: tuple[str, ...]) -> dict[str, Any]:
    """Every knob of the snapshot's editable Python files, as plain values (a file that does not
    parse, as in a `crash:syntax` run, has none: its `--set` values are in `set`)."""
    from nightlab import snapshots
    from nightlab.errors import NightlabError
    from nightlab.search.knobs import list_knobs

    out: dict[str, Any] = {}
    for name in editable:
        if not name.endswith(".py"):
            continue
        try:
            source = snapshots.read_file(lab_dir, commit, name).decode("utf-8", errors="replace")
            knobs = list_knobs(source)
        except (NightlabError, SyntaxError, ValueError):
            continue
        for k in knobs:
            value = k.value
            out[k.name] = value if isinstance(value, (int, float, str, bool)) or value is None else k.source
    return out


def incumbent_points(exps: list[Experiment], metric: str, *, lower_is_better: bool) -> dict[str, list]:
    """The incumbent's line per tier, as progress.png draws it: (experiment seq, experiment id,
    the best kept snapshot's mean so far) at each kept snapshot's entry (`report.kept_snapshots`)."""
    from nightlab.judge import kept
    from nightlab.report import adopted_identities, kept_snapshots

    ok = [e for e in exps if e.ok and e.metric(metric) is not None]
    adopted = adopted_identities(ok)
    better = min if lower_is_better else max
    out: dict[str, list] = {}
    for tier in sorted({e.tier for e in ok}):
        best, points = None, []
        for entry, mean in kept_snapshots([e for e in ok if e.tier == tier and kept(e, adopted)], metric):
            best = mean if best is None else better(best, mean)
            points.append((entry.seq, entry.id, best))
        if points:
            out[tier] = points
    return out
