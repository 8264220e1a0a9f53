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
  changes nothing and returns None. That single check is what makes every experiment
  end exactly once even when a controller dies and a second one takes over.

Layout: `_schema` (SCHEMA_VERSION, MIGRATIONS), `_rows` (the frozen row dataclasses,
`ExperimentStatus`, `Verdict`, `Outcome` (from `nightlab.outcome`), `AttemptEnd`, `Source`, decoders), `_base` (`BaseLedger`: the connection and every read),
`_ledger` (`Ledger`: migrations and every write; `open_ledger`), `_agent_runs` (the agent
supervisor's run and sessions, written through `Ledger`), `_readonly`
(`ReadOnlyLedger`, the dashboard's), `_recover` (what a restore reads from a damaged ledger and writes back), `_trackers` (the experiment trackers' cursor and runs). Every SQL statement of nightlab lives in this package.
"""

from nightlab.ledger._base import BaseLedger
from nightlab.ledger._ledger import Ledger, open_ledger
from nightlab.ledger._readonly import ReadOnlyLedger
from nightlab.ledger._recover import RecoveryPlan, RunEnd, Salvage, read_damaged
from nightlab.ledger._rows import (
    LEGACY_IDENTITY_KEY,
    AgentRun,
    AgentRunStatus,
    Attempt,
    AttemptEnd,
    ControllerRecord,
    Event,
    Experiment,
    ExperimentStatus,
    NewExperiment,
    Outcome,
    RankKey,
    SearchProgress,
    Source,
    Verdict,
    Wave,
    Worker,
    WorkerState,
)
from nightlab.ledger._schema import MIGRATIONS, SCHEMA_VERSION
from nightlab.ledger._trackers import TrackerRun, TrackerState

__all__ = [
    "LEGACY_IDENTITY_KEY",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "AgentRun",
    "AgentRunStatus",
    "Attempt",
    "AttemptEnd",
    "BaseLedger",
    "ControllerRecord",
    "Event",
    "Experiment",
    "ExperimentStatus",
    "Ledger",
    "NewExperiment",
    "Outcome",
    "RankKey",
    "ReadOnlyLedger",
    "RecoveryPlan",
    "RunEnd",
    "Salvage",
    "SearchProgress",
    "Source",
    "TrackerRun",
    "TrackerState",
    "Verdict",
    "Wave",
    "Worker",
    "WorkerState",
    "open_ledger",
    "read_damaged",
]
