"""The backend interface: how a worker executes one attempt.

A backend is small on purpose (launch / poll / kill, plus optional fleet set-up and
tear-down); the controller owns everything else: leasing, timeouts, classification,
retries and the ledger. Handles are plain JSON dicts stored with the attempt, so a
controller that restarts can `poll` runs that an earlier controller launched.

`VerdictPolicy` is the other interface the controller is handed: how a finished run is judged
(the lab's is `nightlab.judge.Judge`; the fleet never imports it).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from nightlab.ledger import Experiment, Outcome


@dataclass(frozen=True)
class WorkerSlot:
    """One place that runs one experiment at a time."""

    name: str
    tier: str
    backend: str
    env: dict[str, str] = field(default_factory=dict)  # e.g. CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS
    info: dict[str, Any] = field(default_factory=dict)  # shown by `fleet status` (gpu, threads, cluster)


@dataclass(frozen=True)
class RunSpec:
    """Everything a backend needs to execute one attempt."""

    experiment_id: str
    attempt: int
    snapshot: str  # commit hash
    command: str
    env: dict[str, str]  # NIGHTLAB_* and the slot's variables, on top of the worker's environment
    timeout: float
    run_dir: Path  # local folder for this attempt: log.txt (and work/ for the local backend)
    lab_dir: Path

    @property
    def log_path(self) -> Path:
        return self.run_dir / "log.txt"


@dataclass(frozen=True)
class RunExit:
    """A run that has ended. `exit_code` is None when it vanished without a status."""

    exit_code: int | None
    lost: bool = False
    detail: str | None = None
    code: str | None = None  # code hash of the nightlab a remote worker ran (`fleet/build.py`)
    health: dict[str, Any] | None = None  # what a remote worker's sampler measured (`fleet/worker_health.py`)


class BaseBackend(abc.ABC):
    """Contract for implementers.

    - `launch` must return quickly (it is on the dispatch path) with a JSON-able handle.
    - `poll` must not block; it returns None while the run is alive, a `RunExit` once it
      has ended, and must work on a handle from an earlier controller process.
    - `kill` stops the whole run (its process group, its remote job) and may be called twice.
    - After `poll` returns a `RunExit`, the run's log is complete at `spec.log_path`.
    """

    name: str = "base"

    @abc.abstractmethod
    def launch(self, slot: WorkerSlot, spec: RunSpec) -> dict[str, Any]: ...

    @abc.abstractmethod
    def poll(self, slot: WorkerSlot, spec: RunSpec, handle: dict[str, Any]) -> RunExit | None: ...

    @abc.abstractmethod
    def kill(self, slot: WorkerSlot, spec: RunSpec, handle: dict[str, Any]) -> None: ...

    def available(self, slot: WorkerSlot) -> bool:
        """Whether the slot can take a new run now (a relaunching cluster cannot). Must not block."""
        return True

    def started(self, slot: WorkerSlot, spec: RunSpec, handle: dict[str, Any]) -> float | None:
        """When the run began to execute (epoch seconds); None while it waits, or when it began at launch.

        The controller's deadline counts from here, so time a remote job spends in `sky exec`
        or queued behind the run before it is not taken from its budget. Must not block.
        """
        return None

    def start_patience(self, slot: WorkerSlot, spec: RunSpec) -> float:
        """Seconds past the lease a run may wait before it starts (0: runs start at launch).

        A run not started by then is killed and requeued as `infra`.
        """
        return 0.0

    def queue_depth(self, slot: WorkerSlot) -> int:
        """How many runs may wait on the slot behind the one that runs (queued, never beside it).

        0: the slot is leased its next run only once it is free. N: it is leased another run
        while fewer than N of its runs wait to start (and it holds at most N + 1).
        """
        return 0

    def use_ledger(self, ledger: Any) -> None:
        """Where to record the backend's own events (the controller's ledger, used on its thread only)."""

    def cleanup(self, spec: RunSpec) -> None:
        """Free what the attempt left behind once it has been recorded."""

    def close(self) -> None:
        """Release connections and threads when the controller exits."""


class VerdictPolicy(Protocol):
    """What the controller asks about verdicts; the lab hands one in (`nightlab.judge.Judge`).

    The fleet knows how runs end, never how they are judged: it stores what `end` returns with
    the final end of an attempt, in the same transaction, and calls `ended` afterwards.
    """

    def end(self, exp: Experiment, outcome: Outcome, value: float | None) -> tuple[str | None, dict | None]:
        """The verdict and judged context to store with a final end of `exp`."""
        ...

    def ended(self, exp: Experiment, outcome: Outcome, verdict: str | None, judged: dict | None) -> None:
        """Called once a final end was stored (re-judge what it changed)."""
        ...
