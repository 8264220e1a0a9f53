"""`ReadOnlyLedger`: a ledger connection that cannot write, for the dashboard.

The dashboard must never change a lab, so it does not open a `Ledger` (that migrates the
schema and sets pragmas: writes). This connection is opened with SQLite's `mode=ro` URI and has
none of `Ledger`'s writers: a write cannot be reached through a method, and raw SQL past every
method fails with "attempt to write a readonly database". It refuses a ledger of another schema
version instead of upgrading it (unless asked not to, for `nightlab doctor`).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from nightlab.errors import LedgerError
from nightlab.ledger import _schema
from nightlab.ledger._base import BaseLedger


class ReadOnlyLedger(BaseLedger):
    """The reads of `BaseLedger` over a connection SQLite opens read-only (`mode=ro`)."""

    _opening = "open (read-only)"

    def __init__(self, path: Path | str, *, any_version: bool = False) -> None:
        """`any_version`: also open a ledger of another schema version (`nightlab doctor` reports it)."""
        self._any_version = any_version
        super().__init__(path, create=False)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(
            f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=60.0, isolation_level=None
        )

    def _ready(self) -> None:
        version = self.schema_version()
        if version != _schema.SCHEMA_VERSION and not self._any_version:
            raise LedgerError(
                f"ledger `{self.path}` has schema v{version}, this nightlab reads v{_schema.SCHEMA_VERSION}; "
                "run `nightlab status` once to upgrade it, or upgrade nightlab"
            )

    def __enter__(self) -> ReadOnlyLedger:
        return self
