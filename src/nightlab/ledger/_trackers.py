"""The ledger's side of the experiment trackers (W&B, MLflow: `nightlab.trackers`).

The outbox is the `events` table itself: every end, verdict and adoption is an event written in
the transaction that made it, so a tracker that reads events past its cursor misses nothing, even
across a controller restart, and a tracker that is down only lets its cursor fall behind. Two
tables hold the rest (schema v5):

    trackers      one row per destination (`wandb:entity/project`, `mlflow:uri#experiment`): its
                  cursor (the last event handled), the incumbent points it already has per tier,
                  and its current outage (failures, first failure, last error), cleared by a send
    tracker_runs  what a destination holds of an experiment: its run id, its page (None when
                  unknown, e.g. W&B offline), and the digest of what was sent, so a re-send of
                  unchanged data (a later export, a replayed event) is skipped

Reads are mixed into `BaseLedger` (the dashboard reads links too), writes into `Ledger`; each
write is one `BEGIN IMMEDIATE` transaction.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from nightlab.ledger._rows import ExperimentStatus

# the events that change what a tracker shows of a finished experiment
TRACKED_EVENTS = ("end", "verdict", "adopt")


@dataclass(frozen=True)
class TrackerState:
    """One destination's progress through the outbox and its current outage (None when healthy)."""

    key: str
    cursor: int
    incumbent: dict[str, int]  # tier -> the step (experiment seq) of the last incumbent point sent
    failures: int
    error: str | None
    failing_since: float | None
    updated_at: float


@dataclass(frozen=True)
class TrackerRun:
    """An experiment as one destination holds it."""

    tracker: str
    experiment_id: str
    run_id: str
    url: str | None
    digest: str
    sent_at: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _to_state(row: Any) -> TrackerState:
    return TrackerState(
        key=row["key"],
        cursor=row["cursor"],
        incumbent=json.loads(row["incumbent"]),
        failures=row["failures"],
        error=row["error"],
        failing_since=row["failing_since"],
        updated_at=row["updated_at"],
    )


def _to_run(row: Any) -> TrackerRun:
    return TrackerRun(*(row[k] for k in ("tracker", "experiment_id", "run_id", "url", "digest", "sent_at")))


class TrackerReads:
    """Reads of the tracker tables (mixed into `BaseLedger`)."""

    def tracker_state(self, key: str) -> TrackerState | None:
        rows = self._query("SELECT * FROM trackers WHERE key = ?", (key,))  # type: ignore[attr-defined]
        return _to_state(rows[0]) if rows else None

    def tracker_runs(self, experiment_id: str) -> list[TrackerRun]:
        """Every destination's run of one experiment."""
        rows = self._query(  # type: ignore[attr-defined]
            "SELECT * FROM tracker_runs WHERE experiment_id = ? ORDER BY tracker", (experiment_id,)
        )
        return [_to_run(r) for r in rows]

    def tracker_digests(self, key: str) -> dict[str, str]:
        """experiment id -> the digest of what destination `key` holds of it."""
        rows = self._query(  # type: ignore[attr-defined]
            "SELECT experiment_id, digest FROM tracker_runs WHERE tracker = ?", (key,)
        )
        return {r["experiment_id"]: r["digest"] for r in rows}

    def tracker_pending(self, *, after: int, limit: int) -> list[tuple[int, str]]:
        """(event id, experiment id) of the outbox past `after`: ends, verdicts and adoptions of
        finished experiments, oldest first (an end that requeued an `infra` attempt is not one)."""
        rows = self._query(  # type: ignore[attr-defined]
            "SELECT ev.id, ev.experiment_id FROM events ev JOIN experiments e ON e.id = ev.experiment_id"
            f" WHERE ev.id > ? AND ev.kind IN ({','.join('?' * len(TRACKED_EVENTS))}) AND e.status = ?"
            " ORDER BY ev.id LIMIT ?",
            (after, *TRACKED_EVENTS, int(ExperimentStatus.FINISHED), limit),
        )
        return [(r[0], r[1]) for r in rows]

    def tracker_backlog(self, key: str) -> int:
        """How many finished experiments destination `key` has not been sent in their latest state."""
        state = self.tracker_state(key)
        rows = self._query(  # type: ignore[attr-defined]
            "SELECT COUNT(DISTINCT ev.experiment_id) FROM events ev JOIN experiments e ON e.id = ev.experiment_id"
            f" WHERE ev.id > ? AND ev.kind IN ({','.join('?' * len(TRACKED_EVENTS))}) AND e.status = ?",
            (state.cursor if state else 0, *TRACKED_EVENTS, int(ExperimentStatus.FINISHED)),
        )
        return int(rows[0][0])

    def tracker_sent_count(self, key: str) -> int:
        rows = self._query("SELECT COUNT(*) FROM tracker_runs WHERE tracker = ?", (key,))  # type: ignore[attr-defined]
        return int(rows[0][0])


class TrackerWrites:
    """Writes of the tracker tables (mixed into `Ledger`)."""

    def lab_id(self) -> str:
        """The lab's stable id (created once): tracker run ids derive from it and the experiment id,
        so two labs never share a run id, and a re-export finds the runs it made before."""
        with self.transaction() as c:  # type: ignore[attr-defined]
            c.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('lab_id', ?)", (uuid.uuid4().hex[:10],)
            )
            return c.execute("SELECT value FROM meta WHERE key = 'lab_id'").fetchone()[0]

    def tracker_sent(
        self, key: str, experiment_id: str, *, run_id: str, url: str | None, digest: str
    ) -> None:
        """Record what destination `key` now holds of an experiment; a send ends an outage."""
        now = time.time()
        with self.transaction() as c:  # type: ignore[attr-defined]
            c.execute(
                "INSERT OR REPLACE INTO tracker_runs (tracker, experiment_id, run_id, url, digest, sent_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (key, experiment_id, run_id, url, digest, now),
            )
            _upsert(c, key, now, "failures = 0, error = NULL, failing_since = NULL")

    def tracker_advance(
        self, key: str, *, cursor: int | None = None, incumbent: dict[str, int] | None = None
    ) -> None:
        """Move destination `key`'s cursor (never backwards) and record its incumbent points."""
        now = time.time()
        sets, args = ["failures = 0", "error = NULL", "failing_since = NULL"], []
        if cursor is not None:
            sets.append("cursor = MAX(cursor, ?)")
            args.append(cursor)
        if incumbent is not None:
            sets.append("incumbent = ?")
            args.append(json.dumps(incumbent, sort_keys=True))
        with self.transaction() as c:  # type: ignore[attr-defined]
            _upsert(c, key, now, ", ".join(sets), args)

    def tracker_failed(self, key: str, error: str) -> TrackerState:
        """Count a failed send to `key`; returns the new state (`failures == 1`: an outage began)."""
        now = time.time()
        with self.transaction() as c:  # type: ignore[attr-defined]
            _upsert(
                c,
                key,
                now,
                "failures = failures + 1, error = ?, failing_since = COALESCE(failing_since, ?)",
                [error[:2000], now],
            )
            row = c.execute("SELECT * FROM trackers WHERE key = ?", (key,)).fetchone()
        return _to_state(row)


def _upsert(c: Any, key: str, now: float, sets: str, args: list[Any] | tuple = ()) -> None:
    c.execute("INSERT OR IGNORE INTO trackers (key, updated_at) VALUES (?, ?)", (key, now))
    c.execute(f"UPDATE trackers SET {sets}, updated_at = ? WHERE key = ?", (*args, now, key))
