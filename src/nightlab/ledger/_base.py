"""`BaseLedger`: one connection to a lab's ledger and every read a ledger offers.

`Ledger` (read-write: migrates, writes inside `transaction()`) and `ReadOnlyLedger` (the
dashboard's, opened `mode=ro`) both derive from it. A subclass says only how its connection
is opened (`_connect`) and what it checks once it is open (`_ready`); the reads are shared, so
the dashboard and the CLI can never query a ledger differently.
"""

from __future__ import annotations

import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from nightlab.bulk import gc_paused
from nightlab.errors import LedgerError, UnknownExperimentError
from nightlab.ledger import integrity
from nightlab.ledger._rows import (
    STATUSES,
    AgentRun,
    Attempt,
    ControllerRecord,
    Event,
    Experiment,
    ExperimentStatus,
    RankKey,
    SearchProgress,
    Wave,
    Worker,
    _to_agent_run,
    _to_attempt,
    _to_controller,
    _to_event,
    _to_experiment,
    _to_search_progress,
    _to_wave,
    _to_worker,
)
from nightlab.ledger._trackers import TrackerReads


class BaseLedger(TrackerReads, ABC):
    """A connection to one lab's ledger database, and its reads.

    Contract for implementers: `_connect()` returns the open connection; `_ready()` runs once
    it is set (pragmas, schema checks or migrations) and may raise `LedgerError`. Every
    `sqlite3.Error` while opening becomes one `LedgerError` line that names the fix.
    """

    _opening = "open"  # the verb of the error message when opening fails

    def __init__(self, path: Path | str, *, create: bool = False, check_wal: bool = True) -> None:
        self.path = Path(path)
        if not create and not self.path.exists():
            raise LedgerError(f"ledger `{self.path}` does not exist; run `nightlab init` to create a lab")
        # the WAL is checked before SQLite opens the file: its recovery would silently drop a cut tail
        try:
            self._conn, self._hold = integrity.open_checked(self.path, self._connect, check=check_wal)
        except sqlite3.Error as e:
            raise integrity.explain(e, self.path, self._opening) from e
        try:
            self._conn.row_factory = sqlite3.Row
            self._conn.execute("PRAGMA busy_timeout = 60000")
            self._ready()
        except sqlite3.Error as e:
            self.close()
            raise integrity.explain(e, self.path, self._opening) from e
        except BaseException:
            self.close()
            raise

    @abstractmethod
    def _connect(self) -> sqlite3.Connection:
        """Open the SQLite connection (isolation_level=None: BEGIN is issued explicitly)."""

    @abstractmethod
    def _ready(self) -> None:
        """Prepare or check the freshly opened connection; raise `LedgerError` to refuse it."""

    # ------------------------------------------------------------------ plumbing

    def close(self) -> None:
        """Close the connection (the hold is given back once)."""
        self._conn.close()
        integrity.release(self._hold)
        self._hold = None

    def __enter__(self) -> BaseLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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

    def version(self) -> int:
        """The id of the latest event: it grows with every change the lab records."""
        return int(self._query("SELECT COALESCE(MAX(id), 0) FROM events")[0][0])

    def meta(self, key: str) -> str | None:
        rows = self._query("SELECT value FROM meta WHERE key = ?", (key,))
        return rows[0]["value"] if rows else None

    # ------------------------------------------------------------------ experiments

    def count(self) -> int:
        """How many experiments the ledger holds (every status)."""
        return int(self._query("SELECT COUNT(*) FROM experiments")[0][0])

    def snapshot_states(self) -> list[tuple[str, str, ExperimentStatus]]:
        """(id, snapshot commit, status) of every experiment, in submission order: no row decoding."""
        rows = self._query("SELECT id, snapshot, status FROM experiments ORDER BY seq")
        return [(r["id"], r["snapshot"], ExperimentStatus(r["status"])) for r in rows]

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
        identity: str | None = None,
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
        for column, value in (("tier", tier), ("wave", wave), ("identity", identity), ("parent", parent)):
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
        with gc_paused():
            return [_to_experiment(r, metrics.get(r["id"], {})) for r in rows]

    def rank_keys(self, metric: str, *, tier: str | None = None) -> list[RankKey]:
        """Every experiment (of `tier`) as a `RankKey` for `metric`, in submission order.

        Reads a dozen columns and one metric per experiment: no JSON is decoded but the judged
        incumbent's identity and figure (by SQLite). Decode the rows you show with `experiments(ids=...)`.
        """
        where, args = ("WHERE e.tier = ?", [tier]) if tier is not None else ("", [])
        rows = self._query(
            "SELECT e.id, e.seq, e.tier, e.identity, e.epoch, e.status, e.outcome, e.verdict,"
            " json_extract(e.judged, '$.identity'), m.value, e.finished_at, e.adopted_at, e.description,"
            " json_extract(e.judged, '$.mean'), json_extract(e.judged, '$.n')"
            " FROM experiments e"
            f" LEFT JOIN metrics m ON m.experiment_id = e.id AND m.key = ? {where} ORDER BY e.seq",
            [metric, *args],
        )
        return [
            RankKey(
                r[0],
                r[1],
                r[2],
                r[3],
                r[4],
                STATUSES[r[5]],
                r[6],
                r[7],
                r[8],
                metric,
                r[9],
                r[10],
                r[11],
                r[12],
                r[13],
                r[14],
            )
            for r in rows
        ]

    def by_commit(self, column: str, commits: Iterable[str]) -> list[Experiment]:
        """Experiments whose `snapshot` or `parent` is one of `commits`, in submission order (no metrics)."""
        if column not in ("snapshot", "parent"):
            raise ValueError(f"`{column}` is not a commit column")
        wanted = sorted(set(commits))
        rows = []
        for start in range(0, len(wanted), 500):  # SQLite's bound-parameter limit
            chunk = wanted[start : start + 500]
            rows += self._query(
                f"SELECT * FROM experiments WHERE {column} IN ({','.join('?' * len(chunk))})", chunk
            )
        return [_to_experiment(r) for r in sorted(rows, key=lambda r: r["seq"])]

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

    def infra_retries(self) -> dict[str, str]:
        """Queued experiments whose last attempt ended `infra`: id -> the worker it ended on.

        The controller places such a retry on another worker of its tier (`Controller._dispatch`).
        """
        rows = self._query(
            "SELECT e.id, a.worker FROM experiments e JOIN attempts a"
            " ON a.experiment_id = e.id AND a.number = e.attempts"
            " WHERE e.status = ? AND e.attempts > 0 AND a.failure = 'infra'",
            (int(ExperimentStatus.QUEUED),),
        )
        return {r["id"]: r["worker"] for r in rows}

    def find_measured(self, identity: str, tier: str, seed: int) -> Experiment | None:
        """An experiment of the same files, tier and seed that is queued, running or finished ok."""
        rows = self._query(
            "SELECT * FROM experiments WHERE identity = ? AND tier = ? AND seed = ? AND"
            " (status IN (?, ?) OR (status = ? AND outcome = 'ok')) ORDER BY seq LIMIT 1",
            (
                identity,
                tier,
                seed,
                int(ExperimentStatus.QUEUED),
                int(ExperimentStatus.RUNNING),
                int(ExperimentStatus.FINISHED),
            ),
        )
        return _to_experiment(rows[0]) if rows else None

    def seeds_used(self, identity: str, tier: str) -> set[int]:
        rows = self._query(
            "SELECT seed FROM experiments WHERE identity = ? AND tier = ? AND status != ?",
            (identity, tier, int(ExperimentStatus.CANCELLED)),
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

    # ------------------------------------------------------------------ attempts

    def open_attempts(self) -> list[Attempt]:
        """Attempts that started and have not ended: what a restarted controller must re-attach."""
        rows = self._query("SELECT * FROM attempts WHERE ended_at IS NULL ORDER BY id")
        return [_to_attempt(r) for r in rows]

    def attempts(self, experiment_id: str) -> list[Attempt]:
        rows = self._query("SELECT * FROM attempts WHERE experiment_id = ? ORDER BY number", (experiment_id,))
        return [_to_attempt(r) for r in rows]

    # ------------------------------------------------------------------ waves, workers, controller, events

    def wave(self, wave_id: str) -> Wave:
        rows = self._query("SELECT * FROM waves WHERE id = ?", (wave_id,))
        if not rows:
            raise UnknownExperimentError(f"unknown wave `{wave_id}`; list them with `nightlab waves`")
        return _to_wave(rows[0])

    def waves(self) -> list[Wave]:
        return [_to_wave(r) for r in self._query("SELECT * FROM waves ORDER BY seq")]

    def search_waves(self, key: Mapping[str, Any] | None = None) -> list[SearchProgress]:
        """The progress of every search wave (of the search `key` only, when given), oldest first."""
        rows = self._query("SELECT s.* FROM search_waves s JOIN waves w ON w.id = s.wave_id ORDER BY w.seq")
        out = [_to_search_progress(r) for r in rows]
        return out if key is None else [p for p in out if p.key == dict(key)]

    def search_progress(self, wave_id: str) -> SearchProgress | None:
        """The progress of a search wave; None for a wave that no search submitted."""
        rows = self._query("SELECT * FROM search_waves WHERE wave_id = ?", (wave_id,))
        return _to_search_progress(rows[0]) if rows else None

    def workers(self) -> list[Worker]:
        return [_to_worker(r) for r in self._query("SELECT * FROM workers ORDER BY name")]

    def agent_run(self) -> AgentRun | None:
        """The agent supervisor's run, with its sessions; None when no supervisor ran (or imported)."""
        rows = self._query("SELECT * FROM agent_run WHERE id = 1")
        if not rows:
            return None
        return _to_agent_run(rows[0], self._query("SELECT data FROM agent_sessions ORDER BY n"))

    def controller(self) -> ControllerRecord | None:
        rows = self._query("SELECT * FROM controller WHERE id = 1")
        return _to_controller(rows[0]) if rows else None

    def controller_session(self) -> tuple[float, float] | None:
        """(start, end) of the latest controller session, or None when no controller ever ran.

        A live record runs to its last heartbeat; a stopped one from its `controller-start`
        event to the `controller-stop` after it (or to its start when it never stopped cleanly).
        """
        record = self.controller()
        if record is not None:
            return record.started_at, max(record.heartbeat_at, record.started_at)
        start = self._query(
            "SELECT id, ts FROM events WHERE kind = 'controller-start' ORDER BY id DESC LIMIT 1"
        )
        if not start:
            return None
        stop = self._query(
            "SELECT ts FROM events WHERE kind = 'controller-stop' AND id > ? ORDER BY id LIMIT 1",
            (start[0]["id"],),
        )
        return start[0]["ts"], stop[0]["ts"] if stop else start[0]["ts"]

    def rerun_links(self, experiment_id: str) -> tuple[str | None, str | None]:
        """(the degraded experiment this one re-runs, the re-run queued for this one), None where none."""
        of = self._query(
            "SELECT json_extract(data, '$.of') AS of FROM events WHERE kind = 'rerun' AND experiment_id = ?",
            (experiment_id,),
        )
        rerun = self._query(
            "SELECT experiment_id FROM events WHERE kind = 'rerun' AND json_extract(data, '$.of') = ?",
            (experiment_id,),
        )
        return (of[0]["of"] if of else None, rerun[0]["experiment_id"] if rerun else None)

    def recent_wall_seconds(self, tier: str, limit: int) -> list[float]:
        """Start-to-end seconds of the last `limit` ok runs of `tier`, oldest first (no row decoded)."""
        rows = self._query(
            "SELECT finished_at - started_at AS wall FROM experiments"
            " WHERE status = ? AND tier = ? AND outcome = 'ok'"
            " AND started_at IS NOT NULL AND finished_at IS NOT NULL ORDER BY seq DESC LIMIT ?",
            (int(ExperimentStatus.FINISHED), tier, limit),
        )
        return [r["wall"] for r in reversed(rows)]

    def recent_outcomes(self, limit: int) -> list[str | None]:
        """The outcomes of the last `limit` experiments that ran to an end (cancelled ones left out), newest first."""
        rows = self._query(
            "SELECT outcome FROM experiments WHERE status = ? ORDER BY finished_at DESC LIMIT ?",
            (int(ExperimentStatus.FINISHED), limit),
        )
        return [r["outcome"] for r in rows]

    def training_spans(
        self, since: float, *, metric: str = "training_seconds"
    ) -> list[tuple[ExperimentStatus, float | None, float | None, float | None]]:
        """(status, started_at, finished_at, `metric`) of every run that is running, or finished ok since `since`."""
        rows = self._query(
            "SELECT e.status, e.started_at, e.finished_at, m.value AS training FROM experiments e"
            " LEFT JOIN metrics m ON m.experiment_id = e.id AND m.key = ?"
            " WHERE (e.status = ? AND e.outcome = 'ok' AND e.finished_at >= ?) OR e.status = ?",
            (metric, int(ExperimentStatus.FINISHED), since, int(ExperimentStatus.RUNNING)),
        )
        return [
            (ExperimentStatus(r["status"]), r["started_at"], r["finished_at"], r["training"]) for r in rows
        ]

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
        return [_to_event(r) for r in rows]
