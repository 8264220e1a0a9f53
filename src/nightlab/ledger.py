"""The ledger: every experiment, attempt, metric, wave, worker and event of a lab.

SQLite in WAL mode at `.nightlab/ledger.db` is the one source of truth: the controller,
agents calling the CLI, the search loop and the dashboard all read and write it at once,
each through its own connection. Writers take the database lock with `BEGIN IMMEDIATE`
so two processes can never both lease the same experiment or allocate the same id.

Contract (what every caller may rely on):
- methods are safe to call from many processes; one `Ledger` object belongs to one thread;
- returned objects are frozen snapshots and never change under the caller;
- a finished experiment's outcome and metrics are immutable: `finish_attempt` on an
  attempt that already ended, or that is no longer the experiment's current attempt,
  changes nothing and returns False. That single check is what makes every experiment
  end exactly once even when a controller dies and a second one takes over.
"""

from __future__ import annotations

import enum
import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nightlab import integrity
from nightlab.errors import LedgerError, UnknownExperimentError

SCHEMA_VERSION = 2

# Each entry upgrades the schema from version i to i + 1. Never edit a shipped entry:
# append a new one and a test that upgrades a committed ledger of the old version.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE waves (
        id TEXT PRIMARY KEY,
        seq INTEGER NOT NULL UNIQUE,
        design TEXT NOT NULL,
        description TEXT NOT NULL DEFAULT '',
        spec TEXT NOT NULL DEFAULT '{}',
        tier TEXT,
        base_snapshot TEXT,
        created_at REAL NOT NULL
    );
    CREATE TABLE experiments (
        id TEXT PRIMARY KEY,
        seq INTEGER NOT NULL UNIQUE,
        snapshot TEXT NOT NULL,
        tree TEXT NOT NULL,
        parent TEXT,
        description TEXT NOT NULL,
        tier TEXT NOT NULL,
        seed INTEGER NOT NULL,
        wave TEXT REFERENCES waves(id),
        priority INTEGER NOT NULL DEFAULT 0,
        params TEXT NOT NULL DEFAULT '{}',
        source TEXT NOT NULL DEFAULT 'cli',
        status INTEGER NOT NULL,
        outcome TEXT,
        detail TEXT,
        verdict TEXT,
        attempts INTEGER NOT NULL DEFAULT 0,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        submitted_at REAL NOT NULL,
        started_at REAL,
        finished_at REAL,
        adopted_at REAL
    );
    CREATE INDEX experiments_queue ON experiments(status, tier, priority, seq);
    CREATE INDEX experiments_tree ON experiments(tree, tier, seed);
    CREATE INDEX experiments_wave ON experiments(wave);
    CREATE TABLE attempts (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        experiment_id TEXT NOT NULL REFERENCES experiments(id),
        number INTEGER NOT NULL,
        worker TEXT NOT NULL,
        started_at REAL NOT NULL,
        heartbeat_at REAL NOT NULL,
        ended_at REAL,
        exit_code INTEGER,
        failure TEXT,
        detail TEXT,
        log_path TEXT,
        handle TEXT
    );
    CREATE INDEX attempts_experiment ON attempts(experiment_id);
    CREATE INDEX attempts_open ON attempts(ended_at);
    CREATE TABLE metrics (
        experiment_id TEXT NOT NULL REFERENCES experiments(id),
        key TEXT NOT NULL,
        value REAL,
        text TEXT,
        PRIMARY KEY (experiment_id, key)
    );
    CREATE TABLE workers (
        name TEXT PRIMARY KEY,
        tier TEXT NOT NULL,
        backend TEXT NOT NULL,
        state TEXT NOT NULL,
        experiment_id TEXT,
        info TEXT NOT NULL DEFAULT '{}',
        updated_at REAL NOT NULL
    );
    CREATE TABLE controller (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        pid INTEGER NOT NULL,
        host TEXT NOT NULL,
        started_at REAL NOT NULL,
        heartbeat_at REAL NOT NULL,
        stop_requested INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        ts REAL NOT NULL,
        kind TEXT NOT NULL,
        experiment_id TEXT,
        worker TEXT,
        data TEXT NOT NULL DEFAULT '{}'
    );
    CREATE INDEX events_experiment ON events(experiment_id);
    """,
    # v2 (issue 21): the machine health of a run (JSON, `fleet.health.Health`), what its
    # verdict was judged against (JSON: incumbent snapshot, figure, n) and its comparison
    # epoch (the key of the measurement setup: budget, profile, metric, timeout)
    """
    ALTER TABLE experiments ADD COLUMN health TEXT;
    ALTER TABLE experiments ADD COLUMN judged TEXT;
    ALTER TABLE experiments ADD COLUMN epoch TEXT NOT NULL DEFAULT '';
    """,
]


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
        return self.name.lower()


class _AsDict:
    """`to_dict()` for the frozen rows: every field, as plain data for `--json`."""

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Experiment(_AsDict):
    id: str
    seq: int
    snapshot: str
    tree: str
    parent: str | None
    description: str
    tier: str
    seed: int
    wave: str | None
    priority: int
    params: dict[str, str]
    source: str
    status: ExperimentStatus
    outcome: str | None
    detail: str | None
    verdict: str | None
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
        return self.status == ExperimentStatus.FINISHED and self.outcome == "ok"

    @property
    def degraded(self) -> bool:
        """Finished with a summary, but its machine starved or throttled it: never judged."""
        return self.status == ExperimentStatus.FINISHED and self.outcome == "degraded"

    def metric(self, key: str) -> float | None:
        value = self.metrics.get(key)
        return value if isinstance(value, float) else None

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["status"] = self.status.label
        return d

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
class Worker(_AsDict):
    name: str
    tier: str
    backend: str
    state: str
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
    tree: str
    parent: str | None
    description: str
    tier: str
    seed: int
    wave: str | None = None
    priority: int = 0
    params: dict[str, str] = field(default_factory=dict)
    source: str = "cli"
    epoch: str = ""


def _to_experiment(row: sqlite3.Row, metrics: dict[str, Any] | None = None) -> Experiment:
    return Experiment(
        id=row["id"],
        seq=row["seq"],
        snapshot=row["snapshot"],
        tree=row["tree"],
        parent=row["parent"],
        description=row["description"],
        tier=row["tier"],
        seed=row["seed"],
        wave=row["wave"],
        priority=row["priority"],
        params=json.loads(row["params"]),
        source=row["source"],
        status=ExperimentStatus(row["status"]),
        outcome=row["outcome"],
        detail=row["detail"],
        verdict=row["verdict"],
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


class Ledger:
    """Connection to one lab's ledger database (see the module docstring for the contract)."""

    def __init__(self, path: Path | str, *, create: bool = False, check_wal: bool = True) -> None:
        self.path = Path(path)
        if not create and not self.path.exists():
            raise LedgerError(f"ledger `{self.path}` does not exist; run `nightlab init` to create a lab")
        # before SQLite opens the file: its recovery would silently drop a cut WAL's tail
        problem = integrity.check_wal(self.path) if check_wal else None
        if problem is not None:
            raise integrity.wal_error(self.path, problem)
        try:
            # isolation_level=None: we issue BEGIN ourselves, so a read never holds a lock
            self._conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
            self._conn.row_factory = sqlite3.Row
            self._conn.execute("PRAGMA busy_timeout = 60000")
            self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("PRAGMA synchronous = NORMAL")
            self._conn.execute("PRAGMA foreign_keys = ON")
            self._migrate()
        except sqlite3.Error as e:
            raise integrity.explain(e, self.path, "open") from e

    # ------------------------------------------------------------------ plumbing

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """Write transaction: commits on success, rolls back on any error."""
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            raise integrity.explain(e, self.path, "write to") from e
        try:
            yield self._conn
        except sqlite3.Error as e:
            self._rollback()
            raise integrity.explain(e, self.path, "write to") from e
        except BaseException:
            self._rollback()
            raise
        try:
            self._conn.execute("COMMIT")
        except sqlite3.Error as e:
            self._rollback()
            raise integrity.explain(e, self.path, "commit to") from e

    def _rollback(self) -> None:
        # SQLite already rolls back by itself on some errors (a full disk): then there is nothing to undo
        if self._conn.in_transaction:
            try:
                self._conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass

    def _query(self, sql: str, args: Iterable[Any] = ()) -> list[sqlite3.Row]:
        try:
            return self._conn.execute(sql, tuple(args)).fetchall()
        except sqlite3.Error as e:
            raise integrity.explain(e, self.path, "read") from e

    def check(self, *, full: bool = False) -> list[str]:
        """What SQLite's `quick_check` (or `integrity_check` with `full`) finds wrong; empty when whole."""
        return integrity.quick_check(self._conn, full=full)

    def schema_version(self) -> int:
        has_meta = self._conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
        ).fetchone()
        if not has_meta:
            return 0
        row = self._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0]) if row else 0

    def _migrate(self) -> None:
        version = self.schema_version()
        if version > SCHEMA_VERSION:
            raise LedgerError(
                f"ledger `{self.path}` has schema v{version}, newer than this nightlab (v{SCHEMA_VERSION}); "
                "Please run: pip install -U nightlab"
            )
        if version == SCHEMA_VERSION:
            return
        if version > 0:
            # a migration rewrites tables: keep the old ledger as it was, whatever happens next
            from nightlab.backup import take_backup

            take_backup(self.path, pre_migration_of=version, source=self._conn)
        with self.transaction() as c:
            version = self.schema_version()  # another process may have migrated meanwhile
            for script in MIGRATIONS[version:]:
                for statement in script.split(";"):
                    if statement.strip():
                        c.execute(statement)
            c.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )

    def _event(self, c: sqlite3.Connection, kind: str, experiment_id: str | None = None, **data: Any) -> None:
        worker = data.pop("worker", None)
        c.execute(
            "INSERT INTO events (ts, kind, experiment_id, worker, data) VALUES (?, ?, ?, ?, ?)",
            (time.time(), kind, experiment_id, worker, json.dumps(data, default=str)),
        )

    def log_event(self, kind: str, experiment_id: str | None = None, **data: Any) -> None:
        with self.transaction() as c:
            self._event(c, kind, experiment_id, **data)

    # ------------------------------------------------------------------ experiments

    def add_experiments(self, new: list[NewExperiment], *, before_commit: Any = None) -> list[Experiment]:
        """Queue experiments atomically and return them with their ids.

        `before_commit(experiments)` runs inside the transaction (the lab creates the
        snapshot refs there): if it raises, nothing is recorded.
        """
        now = time.time()
        with self.transaction() as c:
            seq = c.execute("SELECT COALESCE(MAX(seq), 0) FROM experiments").fetchone()[0]
            ids = []
            for item in new:
                seq += 1
                eid = f"e{seq:04d}"
                c.execute(
                    "INSERT INTO experiments (id, seq, snapshot, tree, parent, description, tier, seed, wave,"
                    " priority, params, source, status, submitted_at, epoch)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        eid,
                        seq,
                        item.snapshot,
                        item.tree,
                        item.parent,
                        item.description,
                        item.tier,
                        item.seed,
                        item.wave,
                        item.priority,
                        json.dumps(item.params, sort_keys=True),
                        item.source,
                        int(ExperimentStatus.QUEUED),
                        now,
                        item.epoch,
                    ),
                )
                self._event(c, "submit", eid, tier=item.tier, seed=item.seed, wave=item.wave)
                ids.append(eid)
            rows = [c.execute("SELECT * FROM experiments WHERE id = ?", (i,)).fetchone() for i in ids]
            experiments = [_to_experiment(r) for r in rows]
            if before_commit is not None:
                before_commit(experiments)
        return experiments

    def get(self, experiment_id: str) -> Experiment:
        rows = self._query("SELECT * FROM experiments WHERE id = ?", (experiment_id,))
        if not rows:
            raise UnknownExperimentError(
                f"unknown experiment `{experiment_id}`; list them with `nightlab results --all`"
            )
        return _to_experiment(rows[0], self.metrics_for([experiment_id]).get(experiment_id, {}))

    def experiments(
        self,
        *,
        status: ExperimentStatus | Iterable[ExperimentStatus] | None = None,
        tier: str | None = None,
        wave: str | None = None,
        tree: str | None = None,
        parent: str | None = None,
        ids: Iterable[str] | None = None,
        with_metrics: bool = True,
    ) -> list[Experiment]:
        """Experiments matching every given filter, in submission order."""
        where, args = [], []
        if status is not None:
            statuses = [status] if isinstance(status, ExperimentStatus) else list(status)
            where.append(f"status IN ({','.join('?' * len(statuses))})")
            args += [int(s) for s in statuses]
        for column, value in (("tier", tier), ("wave", wave), ("tree", tree), ("parent", parent)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if ids is not None:
            id_list = list(ids)
            where.append(f"id IN ({','.join('?' * len(id_list))})")
            args += id_list
        sql = "SELECT * FROM experiments"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = self._query(sql + " ORDER BY seq", args)
        if not with_metrics or not rows:
            metrics: dict[str, dict[str, Any]] = {}
        elif not where:
            metrics = self._all_metrics()  # one scan beats thousands of bound ids
        else:
            metrics = self.metrics_for([r["id"] for r in rows])
        return [_to_experiment(r, metrics.get(r["id"], {})) for r in rows]

    def _all_metrics(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for eid, key, value, text in self._query("SELECT experiment_id, key, value, text FROM metrics"):
            out.setdefault(eid, {})[key] = value if value is not None else text
        return out

    def metrics_for(self, ids: list[str]) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        # chunks keep us under SQLite's bound-parameter limit on big ledgers
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            rows = self._query(
                f"SELECT experiment_id, key, value, text FROM metrics WHERE experiment_id IN "
                f"({','.join('?' * len(chunk))})",
                chunk,
            )
            for r in rows:
                out.setdefault(r["experiment_id"], {})[r["key"]] = (
                    r["value"] if r["value"] is not None else r["text"]
                )
        return out

    def cancel_requests(self) -> set[str]:
        """Ids of running experiments someone asked to cancel (the controller polls this)."""
        rows = self._query(
            "SELECT id FROM experiments WHERE status = ? AND cancel_requested = 1",
            (int(ExperimentStatus.RUNNING),),
        )
        return {r["id"] for r in rows}

    def queued_counts(self) -> dict[str, int]:
        """Number of queued experiments per tier (a read: takes no lock)."""
        rows = self._query(
            "SELECT tier, COUNT(*) AS n FROM experiments WHERE status = ? GROUP BY tier",
            (int(ExperimentStatus.QUEUED),),
        )
        return {r["tier"]: r["n"] for r in rows}

    def find_measured(self, tree: str, tier: str, seed: int) -> Experiment | None:
        """An experiment of the same files, tier and seed that is queued, running or finished ok."""
        rows = self._query(
            "SELECT * FROM experiments WHERE tree = ? AND tier = ? AND seed = ? AND"
            " (status IN (?, ?) OR (status = ? AND outcome = 'ok')) ORDER BY seq LIMIT 1",
            (
                tree,
                tier,
                seed,
                int(ExperimentStatus.QUEUED),
                int(ExperimentStatus.RUNNING),
                int(ExperimentStatus.FINISHED),
            ),
        )
        return _to_experiment(rows[0]) if rows else None

    def seeds_used(self, tree: str, tier: str) -> set[int]:
        rows = self._query(
            "SELECT seed FROM experiments WHERE tree = ? AND tier = ? AND status != ?",
            (tree, tier, int(ExperimentStatus.CANCELLED)),
        )
        return {r["seed"] for r in rows}

    def epochs(self) -> list[tuple[str, str, str]]:
        """(epoch key, id of its first experiment, that experiment's snapshot), in order of first use."""
        rows = self._query(
            "SELECT e.epoch, e.id, e.snapshot FROM experiments e JOIN"
            " (SELECT epoch, MIN(seq) AS seq FROM experiments WHERE epoch != '' GROUP BY epoch) f"
            " ON e.seq = f.seq ORDER BY e.seq"
        )
        return [(r["epoch"], r["id"], r["snapshot"]) for r in rows]

    def meta(self, key: str) -> str | None:
        rows = self._query("SELECT value FROM meta WHERE key = ?", (key,))
        return rows[0]["value"] if rows else None

    def rekey(self, keys: dict[str, tuple[str, str]], *, meta: tuple[str, str]) -> int:
        """Set (tree, epoch) of the experiments of each snapshot in `keys`, and a meta entry, at once."""
        changed = 0
        with self.transaction() as c:
            for snapshot, (tree, epoch) in keys.items():
                changed += c.execute(
                    "UPDATE experiments SET tree = ?, epoch = ? WHERE snapshot = ? AND (tree != ? OR epoch != ?)",
                    (tree, epoch, snapshot, tree, epoch),
                ).rowcount
            c.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", meta)
            if changed:
                self._event(c, "rekey", None, experiments=changed, scheme=meta[1])
        return changed

    def set_verdict(
        self, experiment_id: str, verdict: str | None, *, judged: dict[str, Any] | None = None
    ) -> None:
        """Store a verdict and what it was judged against (incumbent snapshot, figure, n).

        The event keeps the earlier verdict and context, so a re-judged run's history stays.
        """
        with self.transaction() as c:
            row = c.execute(
                "SELECT verdict, judged FROM experiments WHERE id = ?", (experiment_id,)
            ).fetchone()
            c.execute(
                "UPDATE experiments SET verdict = ?, judged = COALESCE(?, judged) WHERE id = ?",
                (verdict, json.dumps(judged) if judged else None, experiment_id),
            )
            before = (
                {"was": row["verdict"], "was_judged": json.loads(row["judged"])}
                if row and row["judged"]
                else {}
            )
            self._event(c, "verdict", experiment_id, verdict=verdict, judged=judged, **before)

    def mark_adopted(self, experiment_id: str) -> None:
        with self.transaction() as c:
            c.execute(
                "UPDATE experiments SET adopted_at = ?, verdict = COALESCE(verdict, 'keep') WHERE id = ?",
                (time.time(), experiment_id),
            )
            self._event(c, "adopt", experiment_id)

    def request_cancel(self, experiment_id: str) -> ExperimentStatus:
        """Cancel a queued experiment at once, or ask the controller to stop a running one."""
        with self.transaction() as c:
            row = c.execute("SELECT status FROM experiments WHERE id = ?", (experiment_id,)).fetchone()
            if row is None:
                raise UnknownExperimentError(f"unknown experiment `{experiment_id}`")
            status = ExperimentStatus(row["status"])
            if status == ExperimentStatus.QUEUED:
                c.execute(
                    "UPDATE experiments SET status = ?, outcome = 'cancelled', finished_at = ? WHERE id = ?",
                    (int(ExperimentStatus.CANCELLED), time.time(), experiment_id),
                )
                self._event(c, "cancel", experiment_id)
                return ExperimentStatus.CANCELLED
            if status == ExperimentStatus.RUNNING:
                c.execute("UPDATE experiments SET cancel_requested = 1 WHERE id = ?", (experiment_id,))
                self._event(c, "cancel-requested", experiment_id)
            return status

    # ------------------------------------------------------------------ attempts (controller side)

    def lease_next(
        self,
        worker: str,
        tier: str,
        *,
        handle: dict[str, Any] | None = None,
        skip: Iterable[str] = (),
    ) -> Attempt | None:
        """Atomically move the next queued experiment of `tier` to RUNNING on `worker`.

        Order: highest priority first, then submission order. `skip`: ids this worker must
        not take (a re-run of a degraded result waits for another slot).
        """
        now = time.time()
        skipped = sorted(skip)
        with self.transaction() as c:
            row = c.execute(
                "SELECT id, attempts FROM experiments WHERE status = ? AND tier = ?"
                + (f" AND id NOT IN ({','.join('?' * len(skipped))})" if skipped else "")
                + " ORDER BY priority DESC, seq LIMIT 1",
                (int(ExperimentStatus.QUEUED), tier, *skipped),
            ).fetchone()
            if row is None:
                return None
            number = row["attempts"] + 1
            c.execute(
                "UPDATE experiments SET status = ?, attempts = ?, started_at = COALESCE(started_at, ?)"
                " WHERE id = ?",
                (int(ExperimentStatus.RUNNING), number, now, row["id"]),
            )
            cur = c.execute(
                "INSERT INTO attempts (experiment_id, number, worker, started_at, heartbeat_at, handle)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (row["id"], number, worker, now, now, json.dumps(handle or {})),
            )
            c.execute(
                "UPDATE workers SET state = 'busy', experiment_id = ?, updated_at = ? WHERE name = ?",
                (row["id"], now, worker),
            )
            self._event(c, "start", row["id"], worker=worker, attempt=number)
            attempt = c.execute("SELECT * FROM attempts WHERE id = ?", (cur.lastrowid,)).fetchone()
        return _to_attempt(attempt)

    def update_attempt(
        self, attempt_id: int, *, handle: dict[str, Any] | None = None, log_path: str | None = None
    ) -> None:
        with self.transaction() as c:
            if handle is not None:
                c.execute("UPDATE attempts SET handle = ? WHERE id = ?", (json.dumps(handle), attempt_id))
            if log_path is not None:
                c.execute("UPDATE attempts SET log_path = ? WHERE id = ?", (log_path, attempt_id))

    def heartbeat(self, attempt_ids: Iterable[int]) -> None:
        ids = list(attempt_ids)
        if not ids:
            return
        with self.transaction() as c:
            c.execute(
                f"UPDATE attempts SET heartbeat_at = ? WHERE id IN ({','.join('?' * len(ids))})",
                (time.time(), *ids),
            )

    def open_attempts(self) -> list[Attempt]:
        """Attempts that started and have not ended: what a restarted controller must re-attach."""
        rows = self._query("SELECT * FROM attempts WHERE ended_at IS NULL ORDER BY id")
        return [_to_attempt(r) for r in rows]

    def attempts(self, experiment_id: str) -> list[Attempt]:
        rows = self._query("SELECT * FROM attempts WHERE experiment_id = ? ORDER BY number", (experiment_id,))
        return [_to_attempt(r) for r in rows]

    def finish_attempt(
        self,
        attempt_id: int,
        *,
        outcome: str,
        exit_code: int | None = None,
        detail: str | None = None,
        metrics: dict[str, Any] | None = None,
        retry: bool = False,
        max_attempts: int = 1,
        worker_state: str = "idle",
        verdict: str | None = None,
        judged: dict[str, Any] | None = None,
        health: dict[str, Any] | None = None,
    ) -> str | None:
        """End an attempt and, through it, its experiment.

        `retry=True` (infrastructure failures) puts the experiment back in the queue while
        it has had fewer than `max_attempts` attempts. `verdict` is stored with a final
        outcome in the same transaction, with `judged` (what it was judged against) and the
        attempt's machine `health`. Returns the experiment's new state
        (`"queued"`, `"finished"`, `"cancelled"`), or None when this attempt had already
        ended or was superseded: nothing is changed then.
        """
        now = time.time()
        with self.transaction() as c:
            a = c.execute("SELECT * FROM attempts WHERE id = ?", (attempt_id,)).fetchone()
            if a is None or a["ended_at"] is not None:
                return None
            e = c.execute("SELECT * FROM experiments WHERE id = ?", (a["experiment_id"],)).fetchone()
            if ExperimentStatus(e["status"]) != ExperimentStatus.RUNNING or e["attempts"] != a["number"]:
                return None
            c.execute(
                "UPDATE attempts SET ended_at = ?, exit_code = ?, failure = ?, detail = ? WHERE id = ?",
                (now, exit_code, outcome, detail, attempt_id),
            )
            # the slot may already run its next experiment: only release it if it is still ours
            c.execute(
                "UPDATE workers SET state = ?, experiment_id = NULL, updated_at = ? WHERE name = ? AND experiment_id = ?",
                (worker_state, now, a["worker"], e["id"]),
            )
            eid = e["id"]
            if outcome == "cancelled":
                state = "cancelled"
                c.execute(
                    "UPDATE experiments SET status = ?, outcome = ?, detail = ?, finished_at = ? WHERE id = ?",
                    (int(ExperimentStatus.CANCELLED), outcome, detail, now, eid),
                )
            elif retry and e["attempts"] < max_attempts and not e["cancel_requested"]:
                state = "queued"
                c.execute(
                    "UPDATE experiments SET status = ? WHERE id = ?", (int(ExperimentStatus.QUEUED), eid)
                )
            else:
                state = "finished"
                c.execute(
                    "UPDATE experiments SET status = ?, outcome = ?, detail = ?, verdict = ?, finished_at = ?,"
                    " judged = ?, health = ? WHERE id = ?",
                    (
                        int(ExperimentStatus.FINISHED),
                        outcome,
                        detail,
                        verdict,
                        now,
                        json.dumps(judged) if judged else None,
                        json.dumps(health) if health else None,
                        eid,
                    ),
                )
                for key, value in (metrics or {}).items():
                    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
                    c.execute(
                        "INSERT OR REPLACE INTO metrics (experiment_id, key, value, text) VALUES (?, ?, ?, ?)",
                        (eid, key, float(value) if numeric else None, None if numeric else str(value)),
                    )
            self._event(c, "end", eid, worker=a["worker"], attempt=a["number"], outcome=outcome, state=state)
        return state

    # ------------------------------------------------------------------ waves

    def add_wave(
        self,
        *,
        design: str,
        description: str = "",
        spec: dict[str, Any] | None = None,
        tier: str | None = None,
        base_snapshot: str | None = None,
    ) -> Wave:
        with self.transaction() as c:
            seq = c.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM waves").fetchone()[0]
            wid = f"w{seq:03d}"
            c.execute(
                "INSERT INTO waves (id, seq, design, description, spec, tier, base_snapshot, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (wid, seq, design, description, json.dumps(spec or {}), tier, base_snapshot, time.time()),
            )
            self._event(c, "wave", None, wave=wid, design=design)
            row = c.execute("SELECT * FROM waves WHERE id = ?", (wid,)).fetchone()
        return _to_wave(row)

    def update_wave_spec(self, wave_id: str, spec: dict[str, Any]) -> None:
        with self.transaction() as c:
            c.execute("UPDATE waves SET spec = ? WHERE id = ?", (json.dumps(spec), wave_id))

    def wave(self, wave_id: str) -> Wave:
        rows = self._query("SELECT * FROM waves WHERE id = ?", (wave_id,))
        if not rows:
            raise UnknownExperimentError(f"unknown wave `{wave_id}`; list them with `nightlab waves`")
        return _to_wave(rows[0])

    def waves(self) -> list[Wave]:
        return [_to_wave(r) for r in self._query("SELECT * FROM waves ORDER BY seq")]

    # ------------------------------------------------------------------ workers and controller

    def register_workers(self, workers: list[tuple[str, str, str, dict[str, Any]]]) -> None:
        """Replace the worker table with (name, tier, backend, info) rows, all idle."""
        now = time.time()
        with self.transaction() as c:
            c.execute("DELETE FROM workers")
            for name, tier, backend, info in workers:
                c.execute(
                    "INSERT INTO workers (name, tier, backend, state, info, updated_at) VALUES (?, ?, ?, 'idle', ?, ?)",
                    (name, tier, backend, json.dumps(info), now),
                )

    def set_worker(
        self, name: str, *, state: str, experiment_id: str | None = None, info: dict | None = None
    ) -> None:
        with self.transaction() as c:
            if info is None:
                c.execute(
                    "UPDATE workers SET state = ?, experiment_id = ?, updated_at = ? WHERE name = ?",
                    (state, experiment_id, time.time(), name),
                )
            else:
                c.execute(
                    "UPDATE workers SET state = ?, experiment_id = ?, info = ?, updated_at = ? WHERE name = ?",
                    (state, experiment_id, json.dumps(info), time.time(), name),
                )

    def workers(self) -> list[Worker]:
        rows = self._query("SELECT * FROM workers ORDER BY name")
        return [
            Worker(
                r["name"],
                r["tier"],
                r["backend"],
                r["state"],
                r["experiment_id"],
                json.loads(r["info"]),
                r["updated_at"],
            )
            for r in rows
        ]

    def claim_controller(self, pid: int, host: str) -> None:
        now = time.time()
        with self.transaction() as c:
            c.execute(
                "INSERT OR REPLACE INTO controller (id, pid, host, started_at, heartbeat_at, stop_requested)"
                " VALUES (1, ?, ?, ?, ?, 0)",
                (pid, host, now, now),
            )
            self._event(c, "controller-start", None, pid=pid, host=host)

    def controller(self) -> ControllerRecord | None:
        rows = self._query("SELECT * FROM controller WHERE id = 1")
        if not rows:
            return None
        r = rows[0]
        return ControllerRecord(
            r["pid"], r["host"], r["started_at"], r["heartbeat_at"], bool(r["stop_requested"])
        )

    def controller_heartbeat(self, pid: int) -> bool:
        """Refresh the controller's heartbeat; False when a stop was requested."""
        with self.transaction() as c:
            c.execute("UPDATE controller SET heartbeat_at = ? WHERE id = 1 AND pid = ?", (time.time(), pid))
            row = c.execute("SELECT stop_requested FROM controller WHERE id = 1").fetchone()
        return not (row and row["stop_requested"])

    def request_controller_stop(self) -> None:
        with self.transaction() as c:
            c.execute("UPDATE controller SET stop_requested = 1 WHERE id = 1")

    def release_controller(self, pid: int) -> None:
        with self.transaction() as c:
            c.execute("DELETE FROM controller WHERE id = 1 AND pid = ?", (pid,))
            c.execute(
                "UPDATE workers SET state = 'stopped', updated_at = ? WHERE state = 'idle'", (time.time(),)
            )
            self._event(c, "controller-stop", None, pid=pid)

    def events(
        self,
        *,
        experiment_id: str | None = None,
        after: int = 0,
        limit: int = 1000,
        kinds: Iterable[str] | None = None,
    ) -> list[Event]:
        sql, args = "SELECT * FROM events WHERE id > ?", [after]
        if experiment_id is not None:
            sql += " AND experiment_id = ?"
            args.append(experiment_id)
        if kinds is not None:
            kind_list = list(kinds)
            sql += f" AND kind IN ({','.join('?' * len(kind_list))})"
            args += kind_list
        rows = self._query(sql + " ORDER BY id LIMIT ?", [*args, limit])
        return [
            Event(r["id"], r["ts"], r["kind"], r["experiment_id"], r["worker"], json.loads(r["data"]))
            for r in rows
        ]


def open_ledger(lab_dir: Path, *, create: bool = False) -> Ledger:
    """The ledger of the lab at `lab_dir` (`.nightlab/ledger.db`)."""
    state = lab_dir / ".nightlab"
    if create:
        os.makedirs(state, exist_ok=True)
    return Ledger(state / "ledger.db", create=create)
