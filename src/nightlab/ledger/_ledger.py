"""`Ledger`: the read-write connection, every write a lab makes, and `open_ledger`.

Each write is one `BEGIN IMMEDIATE` transaction (`transaction()`), so two processes can never
both lease the same experiment or allocate the same id. Opening a ledger migrates it to
`SCHEMA_VERSION` (after a backup of the old one).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from nightlab.errors import LedgerError, UnknownExperimentError
from nightlab.ledger import _recover, _schema, integrity
from nightlab.ledger._agent_runs import AgentRunWrites
from nightlab.ledger._base import BaseLedger
from nightlab.ledger._rows import (
    Attempt,
    AttemptEnd,
    Experiment,
    ExperimentStatus,
    NewExperiment,
    Outcome,
    SearchProgress,
    Wave,
    WorkerState,
    _to_attempt,
    _to_experiment,
    _to_search_progress,
    _to_wave,
)
from nightlab.ledger._trackers import TrackerWrites


class Ledger(AgentRunWrites, TrackerWrites, BaseLedger):
    """Read-write connection to one lab's ledger (see `nightlab.ledger` for the contract)."""

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: we issue BEGIN ourselves, so a read never holds a lock
        return sqlite3.connect(self.path, timeout=60.0, isolation_level=None)

    def _ready(self) -> None:
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA synchronous = NORMAL")
        self._conn.execute("PRAGMA foreign_keys = ON")
        self._migrate()

    def __enter__(self) -> Ledger:
        return self

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

    def _migrate(self) -> None:
        version = self.schema_version()
        if version > _schema.SCHEMA_VERSION:
            raise LedgerError(
                f"ledger `{self.path}` has schema v{version}, newer than this nightlab (v{_schema.SCHEMA_VERSION}); "
                "Please run: pip install -U nightlab"
            )
        if version == _schema.SCHEMA_VERSION:
            return
        with self.transaction() as c:
            version = self.schema_version()  # another process may have migrated meanwhile
            if version == _schema.SCHEMA_VERSION:
                return
            if version > 0:
                # a migration rewrites tables: keep the old ledger as it was, whatever happens
                # next; under the write lock, so processes opening it at once back it up once
                from nightlab.ledger.backup import take_backup

                take_backup(self.path, pre_migration_of=version)
            for script in _schema.MIGRATIONS[version:]:
                for statement in script.split(";"):
                    if statement.strip():
                        c.execute(statement)
            c.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
                (str(_schema.SCHEMA_VERSION),),
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

    def add_experiments(
        self, new: list[NewExperiment], *, before_commit: Any = None, taken: int = 0
    ) -> list[Experiment]:
        """Queue experiments atomically and return them with their ids.

        Ids continue after the highest of: the ledger's experiments, the `id_floor` a restore
        reserved (`recover`), and `taken` (the caller's `evidence.highest_seq`: ids whose snapshot
        ref or run folder exists, which a restored or hand-copied ledger may not know).
        `before_commit(experiments)` runs inside the transaction (the lab creates the
        snapshot refs there): if it raises, nothing is recorded.
        """
        now = time.time()
        with self.transaction() as c:
            seq = max(
                c.execute("SELECT COALESCE(MAX(seq), 0) FROM experiments").fetchone()[0],
                _recover.id_floor(c),
                taken,
            )
            ids = []
            for item in new:
                seq += 1
                eid = f"e{seq:04d}"
                c.execute(
                    "INSERT INTO experiments (id, seq, snapshot, identity, parent, description, tier, seed, wave,"
                    " priority, params, source, status, submitted_at, epoch)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        eid,
                        seq,
                        item.snapshot,
                        item.identity,
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
                extra = {} if item.rerun_of is None else {"rerun_of": item.rerun_of}
                self._event(c, "submit", eid, tier=item.tier, seed=item.seed, wave=item.wave, **extra)
                ids.append(eid)
            rows = [c.execute("SELECT * FROM experiments WHERE id = ?", (i,)).fetchone() for i in ids]
            experiments = [_to_experiment(r) for r in rows]
            if before_commit is not None:
                before_commit(experiments)
        return experiments

    def rekey(self, keys: dict[str, tuple[str, str]], *, meta: tuple[str, str]) -> int:
        """Set (identity, epoch) of the experiments of each snapshot in `keys`, and a meta entry, at once."""
        changed = 0
        with self.transaction() as c:
            for snapshot, (identity, epoch) in keys.items():
                changed += c.execute(
                    "UPDATE experiments SET identity = ?, epoch = ? WHERE snapshot = ? AND (identity != ? OR epoch != ?)",
                    (identity, epoch, snapshot, identity, epoch),
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

    def mark_adopted(self, experiment_id: str, *, verdict: str | None) -> None:
        """Record an adoption and the verdict the adopted run carries (`nightlab.judge` decides it)."""
        with self.transaction() as c:
            c.execute(
                "UPDATE experiments SET adopted_at = ?, verdict = ? WHERE id = ?",
                (time.time(), verdict, experiment_id),
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

    def lease_next(
        self,
        worker: str,
        tier: str,
        *,
        handle: dict[str, Any] | None = None,
        skip: Iterable[str] = (),
        only: Iterable[str] | None = None,
    ) -> Attempt | None:
        """Atomically move the next queued experiment of `tier` to RUNNING on `worker`.

        Order: highest priority first, then submission order. `skip`: ids this worker must
        not take (a re-run of a degraded result waits for another slot). `only`: the ids it
        may take, when not all (a full queue takes only a retry from another worker).
        """
        now = time.time()
        skipped = sorted(skip)
        allowed = None if only is None else sorted(only)
        if allowed == []:
            return None
        with self.transaction() as c:
            row = c.execute(
                "SELECT id, attempts FROM experiments WHERE status = ? AND tier = ?"
                + (f" AND id NOT IN ({','.join('?' * len(skipped))})" if skipped else "")
                + (f" AND id IN ({','.join('?' * len(allowed))})" if allowed else "")
                + " ORDER BY priority DESC, seq LIMIT 1",
                (int(ExperimentStatus.QUEUED), tier, *skipped, *(allowed or [])),
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

    def finish_attempt(
        self,
        attempt_id: int,
        *,
        outcome: Outcome | str,
        exit_code: int | None = None,
        detail: str | None = None,
        metrics: dict[str, Any] | None = None,
        max_attempts: int = 1,
        worker_state: WorkerState = WorkerState.IDLE,
        verdict: str | None = None,
        judged: dict[str, Any] | None = None,
        health: dict[str, Any] | None = None,
    ) -> AttemptEnd | None:
        """End an attempt and, through it, its experiment.

        An `infra` end puts the experiment back in the queue while it has had fewer than
        `max_attempts` attempts and nobody asked to cancel it (`Outcome.is_final`, the rule the
        controller asks too before it asks for a verdict). `verdict` is stored with a final
        outcome in the same transaction, with `judged` (what it was judged against) and the
        attempt's machine `health`. Returns the experiment's new state (`AttemptEnd`), or None
        when this attempt had already ended or was superseded: nothing is changed then.
        """
        outcome = Outcome(outcome)  # an unknown outcome fails here, before anything is written
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
            final = outcome.is_final(
                attempts=e["attempts"],
                max_attempts=max_attempts,
                cancel_requested=bool(e["cancel_requested"]),
            )
            if outcome is Outcome.CANCELLED:
                state = AttemptEnd.CANCELLED
                c.execute(
                    "UPDATE experiments SET status = ?, outcome = ?, detail = ?, finished_at = ? WHERE id = ?",
                    (int(ExperimentStatus.CANCELLED), outcome, detail, now, eid),
                )
            elif not final:
                state = AttemptEnd.QUEUED
                c.execute(
                    "UPDATE experiments SET status = ? WHERE id = ?", (int(ExperimentStatus.QUEUED), eid)
                )
            else:
                state = AttemptEnd.FINISHED
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

    def add_wave(
        self,
        *,
        design: str,
        description: str = "",
        spec: dict[str, Any] | None = None,
        tier: str | None = None,
        base_snapshot: str | None = None,
        search: tuple[Mapping[str, Any], int] | None = None,
    ) -> Wave:
        """Record a wave; `search` = (the search's key, the wave's index) starts its `SearchProgress`
        in the same transaction, so a wave of a search is never without its record."""
        with self.transaction() as c:
            seq = c.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM waves").fetchone()[0]
            wid = f"w{seq:03d}"
            c.execute(
                "INSERT INTO waves (id, seq, design, description, spec, tier, base_snapshot, created_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (wid, seq, design, description, json.dumps(spec or {}), tier, base_snapshot, time.time()),
            )
            if search is not None:
                key, index = search
                c.execute(
                    "INSERT INTO search_waves (wave_id, search_key, idx) VALUES (?, ?, ?)",
                    (wid, json.dumps(dict(key), sort_keys=True), index),
                )
            self._event(c, "wave", None, wave=wid, design=design)
            row = c.execute("SELECT * FROM waves WHERE id = ?", (wid,)).fetchone()
        return _to_wave(row)

    def update_wave_spec(self, wave_id: str, spec: dict[str, Any]) -> None:
        with self.transaction() as c:
            c.execute("UPDATE waves SET spec = ? WHERE id = ?", (json.dumps(spec), wave_id))

    def change_wave_spec(self, wave_id: str, change: Any) -> bool:
        """Read a wave's spec, `change(spec)` it and write it back, in one transaction: two writers
        (the controller and a search loop, `nightlab.rungs`) never overwrite each other. `change`
        returns the new spec, or None to leave it as it is (then this returns False)."""
        with self.transaction() as c:
            row = c.execute("SELECT spec FROM waves WHERE id = ?", (wave_id,)).fetchone()
            new = change(json.loads(row[0]) if row and row[0] else {})
            if new is None:
                return False
            c.execute("UPDATE waves SET spec = ? WHERE id = ?", (json.dumps(new), wave_id))
        return True

    def drop_empty_wave(self, wave_id: str) -> bool:
        """Remove a wave no experiment belongs to (a submission refused after its wave was made)."""
        with self.transaction() as c:
            if c.execute("SELECT 1 FROM experiments WHERE wave = ? LIMIT 1", (wave_id,)).fetchone():
                return False
            c.execute("DELETE FROM waves WHERE id = ?", (wave_id,))
        return True

    def update_search_progress(self, wave_id: str, **changes: Any) -> SearchProgress:
        """Change fields of a search wave's progress in one transaction, and return the new record.

        The read and the write share one `BEGIN IMMEDIATE` transaction, so two writers changing
        different fields of one wave (the loop and a resumed copy of it, a promotion and a settle)
        both land; with a read, then a separate write, the later writer overwrote the earlier's.
        A judged wave's judgement is final: judging it again raises `LedgerError`.
        """
        fields = set(SearchProgress.__dataclass_fields__) - {"wave_id", "key", "index"}
        unknown = set(changes) - fields
        if unknown:
            raise TypeError(f"SearchProgress has no field {', '.join(sorted(unknown))}")
        with self.transaction() as c:
            row = c.execute("SELECT * FROM search_waves WHERE wave_id = ?", (wave_id,)).fetchone()
            if row is None:
                raise UnknownExperimentError(f"wave `{wave_id}` is not a wave of `nightlab search`")
            current = _to_search_progress(row)
            if current.judged and {"judged", "adopted", "verdict"} & set(changes):
                raise LedgerError(
                    f"search wave `{wave_id}` was judged already ({current.verdict}); a judgement is final"
                )
            new = replace(current, **changes)
            stepped = None if new.stepped is None else json.dumps(list(new.stepped))
            c.execute(
                "UPDATE search_waves SET judged = ?, adopted = ?, verdict = ?, promotion = ?, screened = ?,"
                " stepped = ?, settled = ? WHERE wave_id = ?",
                (
                    int(new.judged),
                    new.adopted,
                    new.verdict,
                    new.promotion,
                    new.screened,
                    stepped,
                    int(new.settled),
                    wave_id,
                ),
            )
        return new

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
        self, name: str, *, state: WorkerState, experiment_id: str | None = None, info: dict | None = None
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

    def recover(self, plan: _recover.RecoveryPlan) -> None:
        """Write what `nightlab doctor --restore` recovered (`nightlab.ledger._recover`) in one transaction."""
        with self.transaction() as c:
            _recover.apply_recovery(c, plan)

    def claim_controller(self, pid: int, host: str) -> None:
        now = time.time()
        with self.transaction() as c:
            c.execute(
                "INSERT OR REPLACE INTO controller (id, pid, host, started_at, heartbeat_at, stop_requested)"
                " VALUES (1, ?, ?, ?, ?, 0)",
                (pid, host, now, now),
            )
            self._event(c, "controller-start", None, pid=pid, host=host)

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


def open_ledger(lab_dir: Path, *, create: bool = False) -> Ledger:
    """The ledger of the lab at `lab_dir` (`.nightlab/ledger.db`)."""
    state = lab_dir / ".nightlab"
    if create:
        os.makedirs(state, exist_ok=True)
    return Ledger(state / "ledger.db", create=create)
