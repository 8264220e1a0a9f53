"""What `nightlab doctor --restore` reads from a damaged ledger and writes into the restored one.

A ledger with one bad page often still reads table by table: `read_damaged` takes every
table it can (each in its own try, so a corrupt `experiments` page does not cost the agent's
record), and `apply_recovery` writes a `RecoveryPlan` (built by `nightlab.restore` from that
and from the lab's refs and run folders) into the restored ledger in one transaction.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nightlab.ledger._rows import ExperimentStatus

_TABLES = ("experiments", "metrics", "waves", "search_waves", "agent_run", "agent_sessions")


@dataclass
class Salvage:
    """The rows of a damaged ledger that still read, by table; `unreadable` names the tables that did not."""

    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    submits: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> the submit event's tier, seed
    unreadable: list[str] = field(default_factory=list)


def read_damaged(path: Path) -> Salvage:
    """Every table of the damaged ledger at `path` that reads whole (never raises)."""
    out = Salvage()
    try:
        conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True, timeout=10.0)
    except sqlite3.Error:
        out.unreadable = [*_TABLES, "events"]
        return out
    conn.row_factory = sqlite3.Row
    try:
        for table in _TABLES:
            try:
                out.rows[table] = [dict(r) for r in conn.execute(f"SELECT * FROM {table}")]  # noqa: S608
            except sqlite3.Error:
                out.unreadable.append(table)
        out.rows["experiments"] = [_identity_named(r) for r in out.rows.get("experiments", [])]
        try:
            for r in conn.execute("SELECT experiment_id, data FROM events WHERE kind = 'submit'"):
                out.submits[r["experiment_id"]] = json.loads(r["data"])
        except (sqlite3.Error, ValueError):
            out.unreadable.append("events")
    finally:
        conn.close()
    return out


def _identity_named(row: dict[str, Any]) -> dict[str, Any]:
    """An `experiments` row of a damaged ledger older than schema v6 (no migration ran on it),
    with the v6 names: the `tree` column is `identity`, and so is the key in its `judged` JSON."""
    if "tree" not in row:
        return row
    row = {k: v for k, v in row.items() if k != "tree"} | {"identity": row["tree"]}
    try:
        judged = json.loads(row["judged"]) if row.get("judged") else None
    except ValueError:
        return row  # a damaged cell: restore treats the verdict as it does any unreadable one
    if isinstance(judged, dict) and "tree" in judged:
        judged["identity"] = judged.pop("tree")
        row["judged"] = json.dumps(judged)
    return row


@dataclass(frozen=True)
class RunEnd:
    """An unfinished experiment of the restored ledger, set to what its run folders prove.

    `outcome` None: no attempt ended, so it goes back to the queue (after `attempts`, so its
    next attempt gets a fresh folder); otherwise it is finished with these figures, unjudged.
    """

    experiment_id: str
    attempts: int
    outcome: str | None = None
    detail: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    finished_at: float | None = None
    verdict: str | None = None  # only a damaged ledger's own finished row brings one


@dataclass
class RecoveryPlan:
    """Everything a restore adds to the restored ledger (see `nightlab.restore`)."""

    experiments: list[dict[str, Any]] = field(default_factory=list)  # whole rows of `experiments`
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> key -> value
    ends: list[RunEnd] = field(default_factory=list)
    waves: list[dict[str, Any]] = field(default_factory=list)
    search_waves: list[dict[str, Any]] = field(default_factory=list)
    agent_run: dict[str, Any] | None = None
    agent_sessions: list[dict[str, Any]] | None = None  # None: keep the restored ledger's
    id_floor: int = 0
    summary: dict[str, Any] = field(default_factory=dict)  # stored in the `restore` event


def id_floor(c: sqlite3.Connection) -> int:
    """The highest id sequence number a restore reserved (`meta.id_floor`; 0 when none)."""
    row = c.execute("SELECT value FROM meta WHERE key = 'id_floor'").fetchone()
    return int(row[0]) if row else 0


def _insert(c: sqlite3.Connection, table: str, row: dict[str, Any], *, replace: bool = False) -> None:
    columns = {r[1] for r in c.execute(f"PRAGMA table_info({table})")}
    keys = [k for k in row if k in columns]
    verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
    c.execute(
        f"{verb} INTO {table} ({', '.join(keys)}) VALUES ({', '.join('?' * len(keys))})",  # noqa: S608
        [row[k] for k in keys],
    )


def _set_metrics(c: sqlite3.Connection, experiment_id: str, metrics: dict[str, Any]) -> None:
    for key, value in metrics.items():
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        c.execute(
            "INSERT OR REPLACE INTO metrics (experiment_id, key, value, text) VALUES (?, ?, ?, ?)",
            (experiment_id, key, float(value) if numeric else None, None if numeric else str(value)),
        )


def apply_recovery(c: sqlite3.Connection, plan: RecoveryPlan) -> None:
    """Write `plan` inside the caller's transaction (`Ledger.recover`)."""
    now = time.time()
    # the backup may have been taken while a controller ran: its row would make the next
    # `status` restart a controller that was stopped on purpose, and its slots look busy
    c.execute("DELETE FROM controller")
    c.execute("UPDATE workers SET state = 'stopped', experiment_id = NULL, updated_at = ?", (now,))
    for row in plan.waves:
        _insert(c, "waves", row)
    for row in plan.search_waves:
        _insert(c, "search_waves", row)
    known_waves = {r[0] for r in c.execute("SELECT id FROM waves")}
    for row in plan.experiments:
        if row.get("wave") not in known_waves:
            row = {**row, "wave": None}
        _insert(c, "experiments", row)
    for eid, metrics in plan.metrics.items():
        _set_metrics(c, eid, metrics)
    for end in plan.ends:
        c.execute(
            "UPDATE attempts SET ended_at = ?, failure = 'infra', detail = ? WHERE experiment_id = ? AND ended_at IS NULL",
            (now, "interrupted: the ledger was restored from a backup", end.experiment_id),
        )
        if end.outcome is None:
            c.execute(
                "UPDATE experiments SET status = ?, attempts = MAX(attempts, ?) WHERE id = ?",
                (int(ExperimentStatus.QUEUED), end.attempts, end.experiment_id),
            )
            continue
        c.execute(
            "UPDATE experiments SET status = ?, outcome = ?, detail = ?, verdict = ?,"
            " attempts = MAX(attempts, ?), finished_at = ? WHERE id = ?",
            (
                int(ExperimentStatus.FINISHED),
                end.outcome,
                end.detail,
                end.verdict,
                end.attempts,
                end.finished_at or now,
                end.experiment_id,
            ),
        )
        _set_metrics(c, end.experiment_id, end.metrics)
    if plan.agent_run is not None:
        _insert(c, "agent_run", plan.agent_run, replace=True)
    if plan.agent_sessions is not None:
        c.execute("DELETE FROM agent_sessions")
        for row in plan.agent_sessions:
            _insert(c, "agent_sessions", row)
    c.execute(
        "INSERT OR REPLACE INTO meta (key, value) VALUES ('id_floor', ?)",
        (str(max(plan.id_floor, id_floor(c))),),
    )
    c.execute(
        "INSERT INTO events (ts, kind, experiment_id, worker, data) VALUES (?, 'restore', NULL, NULL, ?)",
        (now, json.dumps(plan.summary, default=str)),
    )
