"""The ledger's writes of the agent supervisor's run (`nightlab agent`): its record and its sessions.

One record (`agent_run`, id 1) and its finished sessions (`agent_sessions`), read by
`BaseLedger.agent_run`. Mixed into `Ledger` as the trackers' writes are (`_trackers.py`); each
write is one `BEGIN IMMEDIATE` transaction.
"""

from __future__ import annotations

import json
from typing import Any

from nightlab.errors import LedgerError
from nightlab.ledger._rows import AGENT_RUN_COUNTERS, AGENT_RUN_JSON, AgentRun

_AGENT_FIELDS = frozenset(f for f in AgentRun.__dataclass_fields__ if f != "sessions")


class AgentRunWrites:
    """Writes of the agent supervisor's run (mixed into `Ledger`)."""

    def start_agent_run(self, run: AgentRun) -> None:
        """Record a new supervisor run (replacing the last one and its sessions) in one transaction."""
        values = run.to_dict()
        sessions = values.pop("sessions")
        columns = list(values)
        with self.transaction() as c:  # type: ignore[attr-defined]
            c.execute(
                f"INSERT OR REPLACE INTO agent_run (id, {', '.join(columns)})"
                f" VALUES (1, {', '.join('?' * len(columns))})",
                [_agent_value(k, values[k]) for k in columns],
            )
            c.execute("DELETE FROM agent_sessions")
            for n, session in enumerate(sessions, 1):
                c.execute(
                    "INSERT INTO agent_sessions (n, data) VALUES (?, ?)",
                    (n, json.dumps(session, default=str)),
                )

    def update_agent_run(self, *, add: dict[str, float] | None = None, **fields: Any) -> AgentRun:
        """Set `fields` and add `add` to counters (`AGENT_RUN_COUNTERS`) in one transaction.

        Returns the record as it is after this change, other writers' changes included.

        Raises:
            LedgerError: no supervisor run is recorded.
            ValueError: a name that is not a field (or, in `add`, not a counter): a caller's bug.
        """
        add = add or {}
        unknown = [k for k in fields if k not in _AGENT_FIELDS] + [
            k for k in add if k not in AGENT_RUN_COUNTERS
        ]
        if unknown:
            raise ValueError(f"not agent run fields: {', '.join(unknown)}")
        sets = [f"{k} = ?" for k in fields] + [f"{k} = {k} + ?" for k in add]
        args = [_agent_value(k, v) for k, v in fields.items()] + list(add.values())
        with self.transaction() as c:  # type: ignore[attr-defined]
            if sets:
                changed = c.execute(f"UPDATE agent_run SET {', '.join(sets)} WHERE id = 1", args).rowcount
            else:
                changed = c.execute("SELECT COUNT(*) FROM agent_run WHERE id = 1").fetchone()[0]
            if not changed:
                raise LedgerError(f"ledger `{self.path}` has no agent supervisor run to update")  # type: ignore[attr-defined]
        run = self.agent_run()  # type: ignore[attr-defined]
        assert run is not None
        return run

    def add_agent_session(self, session: dict[str, Any]) -> None:
        """Append one finished session to the run's sessions (its number is the next one)."""
        with self.transaction() as c:  # type: ignore[attr-defined]
            c.execute(
                "INSERT INTO agent_sessions (n, data)"
                " VALUES ((SELECT COALESCE(MAX(n), 0) + 1 FROM agent_sessions), ?)",
                (json.dumps(session, default=str),),
            )


def _agent_value(key: str, value: Any) -> Any:
    if key in AGENT_RUN_JSON and value is not None:
        return json.dumps(list(value) if isinstance(value, tuple) else value, default=str)
    return value
