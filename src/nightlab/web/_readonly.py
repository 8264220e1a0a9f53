"""A lab opened for reading only: what every dashboard request works on.

The dashboard must never change a lab, so it does not open the ledger through
`Lab`: that migrates the schema and sets pragmas (writes). It opens a
`nightlab.ledger.ReadOnlyLedger` (SQLite `mode=ro`, no writer methods) instead.

One `ReadOnlyLab` per request: a `Ledger` belongs to one thread and FastAPI runs
synchronous endpoints in a thread pool. Opening costs well under a millisecond.
"""

from __future__ import annotations

from pathlib import Path

from nightlab.config import LabConfig, load_lab_config
from nightlab.ledger import ReadOnlyLedger


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
            from nightlab import identity

            self._head = identity.incumbent(self.path).commit
        return self._head

    def head_identity(self) -> str:
        """The incumbent's research identity, of the HEAD read once per lab object."""
        from nightlab import identity

        return identity.of(self.path, self.head())  # a commit hash: cached, no git call

    def version(self) -> str:
        """Changes whenever a result can have changed (an event or a new HEAD); read once per lab object."""
        if self._version is None:
            self._version = f"{self.ledger.version()}-{self.head()[:12]}"
        return self._version
