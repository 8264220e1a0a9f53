"""The ledger's rows as frozen dataclasses, and the one decoder per table from `sqlite3.Row`.

Every object a ledger returns is one of these: a snapshot that never changes under its caller.
`ExperimentStatus` is an `IntEnum` (stored as its integer), never a string; `Outcome` lives in the
leaf module `nightlab.outcome` (the fleet's runner needs it without the ledger) and is re-exported here.
"""

from __future__ import annotations

import enum
import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from nightlab.outcome import Outcome


class ExperimentStatus(enum.IntEnum):
    """Where an experiment is in its life. Only FINISHED and CANCELLED are final."""

    QUEUED = 0
    RUNNING = 1
    FINISHED = 2
    CANCELLED = 3

    def is_finished(self) -> bool:
        return self in (ExperimentStatus.FINISHED, ExperimentStatus.CANCELLED)

    @property
    def label(self) -> str:
        return _LABELS[self]


# `label` is read once per row of every listing: a dict lookup, not enum's `name` descriptor (10x slower)
_LABELS = {s: s.name.lower() for s in ExperimentStatus}
STATUSES = tuple(sorted(ExperimentStatus))  # by stored integer: `STATUSES[row["status"]]` decodes one


def _member(cls: type[enum.StrEnum], value: str) -> Any:
    """`cls(value)` by a dict lookup first: decoding 20,000 rows calls this three times a row, and
    the enum call is ~10x slower. An unknown value still raises `ValueError` from `cls(value)`."""
    return cls._value2member_map_.get(value) or cls(value)


class Verdict(enum.StrEnum):
    """What a finished run says about its snapshot; `nightlab.judge` is the only code that decides one.

    Stored as these strings (a StrEnum compares equal to them, so old ledgers read unchanged).
    """

    KEEP = "keep"  # beats the incumbent by more than the noise (or was adopted)
    WITHIN_NOISE = "within-noise"  # better, but not by more than z standard errors
    DISCARD = "discard"  # no better than the incumbent
    BASELINE = "baseline"  # a run of the lab's starting point (the incumbent, never adopted)
    CRASH = "crash"  # no result: crash, timeout, an infrastructure failure that used up its retries
    INVALID = "invalid"  # the result cannot be trusted (integrity probe, code hash, launch refused)
    DEGRADED = "degraded"  # its machine starved or throttled it: recorded, never judged

    @classmethod
    def read(cls, value: str | None) -> Verdict | None:
        return None if value is None else _member(cls, value)


class AttemptEnd(enum.StrEnum):
    """What `Ledger.finish_attempt` made of an attempt's end: the experiment's state after it."""

    QUEUED = "queued"  # an `infra` end with attempts left: the experiment waits for its next attempt
    FINISHED = "finished"  # a final end (`Outcome.is_final`): the outcome and the verdict are stored
    CANCELLED = "cancelled"


class Source(enum.StrEnum):
    """Who asked for an experiment, which decides whether it is a candidate of its wave."""

    CLI = "cli"  # `nightlab submit` (an agent or a person)
    SWEEP = "sweep"
    SEARCH = "search"
    PROMOTE = "promote"
    SETTLE = "settle"  # repeats that settle a within-noise result
    NOISE = "noise"  # the incumbent's repeats for the noise floor
    REMEASURE = "remeasure"  # the incumbent re-run inside a wave

    @property
    def is_candidate(self) -> bool:
        """Whether a run of this source stands for an idea of its wave (not the incumbent, not a repeat)."""
        return self in _CANDIDATES


_CANDIDATES = frozenset({Source.SWEEP, Source.SEARCH, Source.PROMOTE})

# What the research identity (`nightlab.identity`) was called before ledger schema v6, when the
# column was `tree` (a name that also means git's tree, which it is not). The JSON documents that
# carry an identity (`show`/`results --json` rows, `noise --json`, `journal --json`) still emit it
# under this key too, beside `identity`, so readers written against older nightlab keep working.
LEGACY_IDENTITY_KEY = "tree"


class _AsDict:
    """`to_dict()` for the frozen rows: every field, as plain data for `--json`."""

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Experiment(_AsDict):
    id: str
    seq: int
    snapshot: str
    identity: str
    parent: str | None
    description: str
    tier: str
    seed: int
    wave: str | None
    priority: int
    params: dict[str, str]
    source: Source
    status: ExperimentStatus
    outcome: Outcome | None
    detail: str | None
    verdict: Verdict | None
    attempts: int
    cancel_requested: bool
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    adopted_at: float | None
    metrics: dict[str, Any] = field(default_factory=dict)
    health: dict[str, Any] | None = None  # `fleet.health.Health.to_dict()` of the final attempt
    judged: dict[str, Any] | None = None  # what the verdict was judged against (see `set_verdict`)
    epoch: str = ""  # key of the measurement setup it ran under (`nightlab.identity.epoch_key`)

    @property
    def ok(self) -> bool:
        return self.status == ExperimentStatus.FINISHED and self.outcome == Outcome.OK

    @property
    def degraded(self) -> bool:
        """Finished with a summary, but its machine starved or throttled it: never judged."""
        return self.status == ExperimentStatus.FINISHED and self.outcome == Outcome.DEGRADED

    def metric(self, key: str) -> float | None:
        value = self.metrics.get(key)
        return value if isinstance(value, float) else None

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["status"] = self.status.label
        d[LEGACY_IDENTITY_KEY] = self.identity
        d["judged"] = self.judged_document()
        return d

    def judged_document(self) -> dict[str, Any] | None:
        """`judged` as JSON output carries it: the incumbent's identity under its old key too."""
        if self.judged is None or "identity" not in self.judged:
            return self.judged
        return {**self.judged, LEGACY_IDENTITY_KEY: self.judged["identity"]}

    def brief(self, metric: str) -> dict[str, Any]:
        """The fields a listing of runs shows, with `metric` for an ok run (None otherwise)."""
        return {
            "id": self.id,
            "status": self.status.label,
            "outcome": self.outcome,
            "verdict": self.verdict,
            "tier": self.tier,
            "seed": self.seed,
            "source": self.source,
            "params": self.params,
            "description": self.description,
            metric: self.metric(metric) if self.ok else None,
            "degraded": (self.health or {}).get("reason") if self.degraded else None,
        }


class RankKey(NamedTuple):
    """What ranking an experiment by one metric needs, read without decoding its row.

    `BaseLedger.rank_keys` reads these columns only (no params, health or metrics JSON), so a
    listing of 20,000 experiments ranks them all and decodes just the rows it shows.
    `judged_identity`, `judged_mean` and `judged_n` are the incumbent its verdict was judged against
    and that incumbent's figure then; `value` is the ranked metric (None when the run did not
    report it as a number). A named tuple, not a
    frozen dataclass: built 20,000 times a listing, and a tuple is ~5x cheaper to build.
    """

    id: str
    seq: int
    tier: str
    identity: str
    epoch: str
    status: ExperimentStatus
    outcome: Outcome | None
    verdict: Verdict | None
    judged_identity: str | None
    key: str  # the metric `value` is of
    value: float | None
    finished_at: float | None
    adopted_at: float | None
    description: str
    judged_mean: float | None = None
    judged_n: int | None = None

    # the one rule for both, read from `status` and `outcome` alike
    ok = Experiment.ok
    degraded = Experiment.degraded

    def metric(self, key: str) -> float | None:
        """The ranked metric (as `Experiment.metric` has it); None for any other key: it was not read."""
        return self.value if key == self.key else None

    @classmethod
    def of(cls, e: Experiment, metric: str) -> RankKey:
        """The key of an experiment already decoded (a listing of every row needs no second read)."""
        judged = e.judged or {}
        return cls(
            e.id, e.seq, e.tier, e.identity, e.epoch, e.status, e.outcome, e.verdict, judged.get("identity"), metric,
            e.metric(metric), e.finished_at, e.adopted_at, e.description, judged.get("mean"), judged.get("n"),
        )  # fmt: skip


@dataclass(frozen=True)
class Attempt(_AsDict):
    id: int
    experiment_id: str
    number: int
    worker: str
    started_at: float
    heartbeat_at: float
    ended_at: float | None
    exit_code: int | None
    failure: str | None
    detail: str | None
    log_path: str | None
    handle: dict[str, Any]


@dataclass(frozen=True)
class Wave(_AsDict):
    id: str
    seq: int
    design: str
    description: str
    spec: dict[str, Any]
    tier: str | None
    base_snapshot: str | None
    created_at: float


@dataclass(frozen=True)
class SearchProgress(_AsDict):
    """Where one wave of `nightlab search` stands; changed only by `Ledger.update_search_progress`.

    Attributes:
        wave_id: the wave.
        key: the search's identity (strategy, spaces, tiers): a resumed search finds its waves by it.
        index: the wave's place in the search, 0-based.
        judged: whether the wave's best was judged; then `adopted` and `verdict` are final.
        adopted: the experiment adopted from the wave, if any.
        verdict: the verdict word of the wave's best run (or why there was none to judge).
        promotion: the wave that promoted its screened candidates to the validation tier.
        screened: why nothing was promoted.
        stepped: the runs of the factorial main-effects step; None while not stepped.
        settled: whether the repeats that would settle a within-noise best were run.
    """

    wave_id: str
    key: dict[str, Any]
    index: int
    judged: bool = False
    adopted: str | None = None
    verdict: str | None = None
    promotion: str | None = None
    screened: str | None = None
    stepped: tuple[str, ...] | None = None
    settled: bool = False


class WorkerState(enum.StrEnum):
    """What a worker slot of the `workers` table is doing (its SQL writes these same words)."""

    IDLE = "idle"
    BUSY = "busy"
    STOPPED = "stopped"  # its controller stopped (or stopped it): no work until one runs again


@dataclass(frozen=True)
class Worker(_AsDict):
    name: str
    tier: str
    backend: str
    state: WorkerState
    experiment_id: str | None
    info: dict[str, Any]
    updated_at: float


@dataclass(frozen=True)
class ControllerRecord:
    pid: int
    host: str
    started_at: float
    heartbeat_at: float
    stop_requested: bool


@dataclass(frozen=True)
class Event:
    id: int
    ts: float
    kind: str
    experiment_id: str | None
    worker: str | None
    data: dict[str, Any]


@dataclass(frozen=True)
class NewExperiment:
    """What `Ledger.add_experiments` needs to queue one experiment."""

    snapshot: str
    identity: str
    parent: str | None
    description: str
    tier: str
    seed: int
    wave: str | None = None
    priority: int = 0
    params: dict[str, str] = field(default_factory=dict)
    source: str = "cli"
    epoch: str = ""
    # the degraded experiment this one re-runs (the controller's re-run): its `submit` event says
    # so in the same transaction, so a reader of events never counts it as someone's submission
    rerun_of: str | None = None


def _to_experiment(row: sqlite3.Row, metrics: dict[str, Any] | None = None) -> Experiment:
    # Fills the frozen instance's __dict__ at once instead of calling __init__: a frozen
    # dataclass's __init__ sets each of its 26 fields through object.__setattr__, which was a
    # third of decoding 20,000 rows. Same object (tests/core/test_results_scale.py checks it).
    e = object.__new__(Experiment)
    e.__dict__.update(
        id=row["id"],
        seq=row["seq"],
        snapshot=row["snapshot"],
        identity=row["identity"],
        parent=row["parent"],
        description=row["description"],
        tier=row["tier"],
        seed=row["seed"],
        wave=row["wave"],
        priority=row["priority"],
        params=json.loads(row["params"]),
        source=_member(Source, row["source"]),
        status=STATUSES[row["status"]],
        outcome=Outcome.read(row["outcome"]),
        detail=row["detail"],
        verdict=Verdict.read(row["verdict"]),
        attempts=row["attempts"],
        cancel_requested=bool(row["cancel_requested"]),
        submitted_at=row["submitted_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        adopted_at=row["adopted_at"],
        metrics=metrics or {},
        health=json.loads(row["health"]) if row["health"] else None,
        judged=json.loads(row["judged"]) if row["judged"] else None,
        epoch=row["epoch"],
    )
    return e


def _to_attempt(row: sqlite3.Row) -> Attempt:
    return Attempt(
        id=row["id"],
        experiment_id=row["experiment_id"],
        number=row["number"],
        worker=row["worker"],
        started_at=row["started_at"],
        heartbeat_at=row["heartbeat_at"],
        ended_at=row["ended_at"],
        exit_code=row["exit_code"],
        failure=row["failure"],
        detail=row["detail"],
        log_path=row["log_path"],
        handle=json.loads(row["handle"] or "{}"),
    )


def _to_search_progress(row: sqlite3.Row) -> SearchProgress:
    return SearchProgress(
        wave_id=row["wave_id"],
        key=json.loads(row["search_key"]),
        index=row["idx"],
        judged=bool(row["judged"]),
        adopted=row["adopted"],
        verdict=row["verdict"],
        promotion=row["promotion"],
        screened=row["screened"],
        stepped=None if row["stepped"] is None else tuple(json.loads(row["stepped"])),
        settled=bool(row["settled"]),
    )


def _to_wave(row: sqlite3.Row) -> Wave:
    return Wave(
        id=row["id"],
        seq=row["seq"],
        design=row["design"],
        description=row["description"],
        spec=json.loads(row["spec"]),
        tier=row["tier"],
        base_snapshot=row["base_snapshot"],
        created_at=row["created_at"],
    )


def _to_worker(row: sqlite3.Row) -> Worker:
    return Worker(
        name=row["name"],
        tier=row["tier"],
        backend=row["backend"],
        state=WorkerState(row["state"]),
        experiment_id=row["experiment_id"],
        info=json.loads(row["info"]),
        updated_at=row["updated_at"],
    )


def _to_controller(row: sqlite3.Row) -> ControllerRecord:
    return ControllerRecord(
        pid=row["pid"],
        host=row["host"],
        started_at=row["started_at"],
        heartbeat_at=row["heartbeat_at"],
        stop_requested=bool(row["stop_requested"]),
    )


def _to_event(row: sqlite3.Row) -> Event:
    return Event(
        id=row["id"],
        ts=row["ts"],
        kind=row["kind"],
        experiment_id=row["experiment_id"],
        worker=row["worker"],
        data=json.loads(row["data"]),
    )


# The agent supervisor's record: which columns hold JSON, and which are counters that
# `Ledger.update_agent_run(add=...)` increments in SQL (never read, added to and written back).
AGENT_RUN_JSON = ("command", "limits", "restarts", "api", "api_outages")
AGENT_RUN_COUNTERS = ("experiments_submitted", "restarts_total", "cost_usd")


class AgentRunStatus(enum.StrEnum):
    """The agent supervisor's state (its row stores the first two)."""

    RUNNING = "running"
    STOPPED = "stopped"
    DEAD = "dead"  # never stored: `agent.control.status` says it of a supervisor killed without cleaning up


@dataclass(frozen=True)
class AgentRun(_AsDict):
    """The lab's agent supervisor run (the current or the last one): `nightlab agent status`'s source.

    One row. The supervisor writes it only through `Ledger.start_agent_run`, `update_agent_run`
    (fields set and counters added in one `BEGIN IMMEDIATE` transaction) and `add_agent_session`,
    so a second writer's change is never lost to a read-then-write.
    """

    pid: int
    status: AgentRunStatus
    agent: str
    cli: str | None
    command: tuple[str, ...]
    limits: dict[str, Any]
    started_at: float
    updated_at: float
    lab: str = ""
    session: int | None = None
    agent_pid: int | None = None
    session_started_at: float | None = None
    transcript: str | None = None
    prompt: str | None = None
    last_activity: float = 0.0
    experiments_submitted: int = 0
    restarts: tuple[float, ...] = ()  # restart times within the last hour
    restarts_total: int = 0
    cost_usd: float = 0.0
    api: dict[str, Any] | None = None  # while the model API is down: since, failures, next_try_at, ...
    api_outages: tuple[dict[str, Any], ...] = ()
    error: str | None = None
    stop_reason: str | None = None
    sessions: tuple[dict[str, Any], ...] = ()  # one per finished session, in order

    def to_dict(self) -> dict[str, Any]:
        """The record as the `nightlab agent status --json` document's keys (lists, not tuples)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in super().to_dict().items()}


def _to_agent_run(row: sqlite3.Row, sessions: list[sqlite3.Row]) -> AgentRun:
    values: dict[str, Any] = {}
    for key in row.keys():  # noqa: SIM118 - iterating a sqlite3.Row yields its values
        if key == "id":
            continue
        value = row[key]
        if key in AGENT_RUN_JSON and value is not None:
            value = json.loads(value)
            value = tuple(value) if isinstance(value, list) else value
        values[key] = value
    values["status"] = AgentRunStatus(values["status"])
    return AgentRun(**values, sessions=tuple(json.loads(r["data"]) for r in sessions))
