"""A lab opened for reading only: what every dashboard request works on.

The dashboard must never change a lab, so it does not open the ledger through
`Lab`: that migrates the schema and sets pragmas (writes). Here the SQLite file is
opened with the `mode=ro` URI, so even a bug that reached a `Ledger` writer would fail
with "attempt to write a readonly database" instead of changing anything, and
`transaction()` refuses up front with a clear message.

One `ReadOnlyLab` per request: a `Ledger` belongs to one thread and FastAPI runs
synchronous endpoints in a thread pool. Opening costs well under a millisecond.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path

from nightlab import integrity, snapshots
from nightlab.config import LabConfig, load_lab_config
from nightlab.errors import LedgerError, NightlabError
from nightlab.ledger import SCHEMA_VERSION, Experiment, Ledger, _to_experiment


class ReadOnlyLedger(Ledger):
    """A `Ledger` whose connection cannot write (SQLite `mode=ro`)."""

    def __init__(self, path: Path | str) -> None:  # noqa: D107 - no super(): that would migrate (write)
        self.path = Path(path)
        if not self.path.exists():
            raise LedgerError(f"ledger `{self.path}` does not exist; run `nightlab init` to create a lab")
        problem = integrity.check_wal(self.path)
        if problem is not None:
            raise integrity.wal_error(self.path, problem)
        try:
            self._conn = sqlite3.connect(
                f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=60.0, isolation_level=None
            )
            self._conn.row_factory = sqlite3.Row
            self._conn.execute("PRAGMA busy_timeout = 60000")
            version = self.schema_version()
        except sqlite3.Error as e:
            raise integrity.explain(e, self.path, "open (read-only)") from e
        if version != SCHEMA_VERSION:
            self._conn.close()
            raise LedgerError(
                f"ledger `{self.path}` has schema v{version}, this nightlab reads v{SCHEMA_VERSION}; "
                "run `nightlab status` once to upgrade it, or upgrade nightlab"
            )

    def transaction(self) -> Iterator[sqlite3.Connection]:
        raise NightlabError("the dashboard is read-only: it never writes the ledger")

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

    def version(self) -> int:
        """The id of the latest event: it grows with every change the lab records."""
        return int(self._query("SELECT COALESCE(MAX(id), 0) FROM events")[0][0])


class ReadOnlyLab:
    """The parts of `nightlab.lab.Lab` that reading needs: path, config, ledger, HEAD."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.config: LabConfig = load_lab_config(path).config
        self.ledger = ReadOnlyLedger(path / ".nightlab" / "ledger.db")
        self._version: str | None = None
        self._head: str | None = None

    def close(self) -> None:
        self.ledger.close()

    def __enter__(self) -> ReadOnlyLab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def head(self) -> str:
        """The incumbent commit, read once per lab object (one request): each read is a git process."""
        if self._head is None:
            self._head = snapshots.head(self.path)
        return self._head

    def head_tree(self) -> str:
        from nightlab import identity

        return identity.of(self.path, "HEAD")

    def version(self) -> str:
        """Changes whenever a result can have changed (an event or a new HEAD); read once per lab object."""
        if self._version is None:
            self._version = f"{self.ledger.version()}-{self.head()[:12]}"
        return self._version
