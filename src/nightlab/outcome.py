"""How a run ended, and the one rule for whether that end is its last.

`fleet/runner.py` classifies a run's end (its table says when each outcome applies), the
controller asks `is_final` before it asks the judge for a verdict, and the ledger asks the same
`is_final` to decide whether the experiment goes back to the queue: one rule, so the verdict
stored with an end always belongs to an end that finished the experiment.

A leaf module (stdlib only): the runner, which workers and the dashboard import too, needs the
enum without loading the ledger; the ledger stores it and re-exports it as `nightlab.ledger.Outcome`.
"""

from __future__ import annotations

import enum


class Outcome(enum.StrEnum):
    """How a run ended; stored as these strings (a StrEnum compares equal to them)."""

    OK = "ok"
    CRASH_SYNTAX = "crash:syntax"
    CRASH_EXCEPTION = "crash:exception"
    CRASH_OOM = "crash:oom"
    CRASH_NAN = "crash:nan"
    CRASH_NO_SUMMARY = "crash:no-summary"
    TIMEOUT = "timeout"
    INFRA = "infra"  # the machine's fault: retried on another attempt while retries are left
    INVALID = "invalid"
    CANCELLED = "cancelled"
    DEGRADED = "degraded"

    def is_crash(self) -> bool:
        """Whether the run's own code failed (`crash:<class>`), as opposed to its time, machine or user."""
        return self.value.startswith("crash:")

    def is_final(self, *, attempts: int, max_attempts: int, cancel_requested: bool) -> bool:
        """Whether this end is the experiment's last: every end but an `infra` one with attempts
        left (`attempts` made so far, of `max_attempts`) whose run nobody asked to cancel.

        A final end other than `cancelled` finishes the experiment and carries its verdict.
        """
        if self is not Outcome.INFRA:
            return True
        return attempts >= max_attempts or cancel_requested

    @classmethod
    def read(cls, value: str | None) -> Outcome | None:
        """The member stored as `value`; a dict lookup first: decoding 20,000 rows calls this once a
        row, and the enum call is ~10x slower. An unknown value still raises `ValueError`."""
        return None if value is None else cls._value2member_map_.get(value) or cls(value)  # type: ignore[return-value]
