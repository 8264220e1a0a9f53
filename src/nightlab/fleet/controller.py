"""The controller: one loop per lab that leases queued experiments to free workers.

Each turn of the loop it (1) polls the running attempts, enforcing the hard timeout and
cancellations, and records the ones that ended; (2) leases the next queued experiment
of the right tier to each free worker and launches it; (3) heartbeats. A single process
owns the lab's fleet (the lock in `daemon.py`); the ledger makes everything it does
visible to every other process.

Recovery: a controller that starts finds the attempts an earlier one left open and
polls them like its own. Runs that are still alive are re-attached; runs that ended
while no controller watched are recorded from their status file and log; runs that
vanished are `infra` and go back to the queue. `Ledger.finish_attempt` refuses to end an
attempt twice, so every experiment ends exactly once.

Why one module of ~600 lines: the loop's halves (poll, record, dispatch, recovery) share the
`active` table and the one ledger connection of the controller's thread; what stands alone
lives beside it (`slots.py`, the result rules in `runner.py`, `capacity.py`, `health.py` with
`health_may_judge`, `low_disk.py` (a full disk is the machine's fault), and the verdict policy
that the lab injects).
"""

from __future__ import annotations

import enum
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nightlab.config import LabConfig
from nightlab.errors import LedgerError, NightlabError
from nightlab.fleet.backend import BaseBackend, RunExit, RunSpec, VerdictPolicy, WorkerSlot
from nightlab.fleet.health import HealthWatch, health_may_judge
from nightlab.fleet.local import LocalBackend
from nightlab.fleet.low_disk import DiskGate, disk_full, disk_full_detail
from nightlab.fleet.runner import (
    classify,
    expected_fingerprint,
    expected_val_set,
    max_training_seconds,
    read_tail,
    trim_log,
)
from nightlab.fleet.sidecar import Sidecar
from nightlab.fleet.slots import build_slots
from nightlab.ledger import Attempt, AttemptEnd, Experiment, Ledger, Outcome, WorkerState
from nightlab.rungs import BUDGET_ENV, tier_budget_env

log = logging.getLogger("nightlab.controller")

HEARTBEAT_SECONDS = 1.0
KILL_GRACE_SECONDS = 30.0  # after a kill, how long to wait for the run to report its end


class _Kill(enum.Enum):
    """Why the controller killed a run (its end is then recorded as that, not as what the log says)."""

    TIMEOUT = enum.auto()  # past its deadline after it started
    CANCELLED = enum.auto()  # someone asked (`nightlab cancel`)
    UNSTARTED = enum.auto()  # past its deadline without ever starting: the backend's fault, `infra`


@dataclass
class _Active:
    slot: WorkerSlot
    attempt: Attempt
    spec: RunSpec
    handle: dict[str, Any]
    deadline: float  # lease + timeout + the backend's start patience, then start + timeout
    started: bool = False
    killed: _Kill | None = None
    killed_at: float = 0.0


def _config_blob(lab_dir: Path) -> str | None:
    """The git object of the committed nightlab.toml (None outside a git checkout)."""
    from nightlab.snapshots import git_text

    try:
        return git_text(lab_dir, "rev-parse", "HEAD:nightlab.toml")
    except NightlabError:
        return None


class Controller:
    """The dispatch loop of one lab. `run()` returns when stopped or idle for long enough.

    `policy` decides the verdict of every run that ends for good (`VerdictPolicy`).
    """

    def __init__(
        self,
        lab_dir: Path,
        config: LabConfig,
        ledger: Ledger,
        *,
        slots: list[WorkerSlot],
        backends: dict[str, BaseBackend],
        policy: VerdictPolicy,
        poll_interval: float = 0.02,
        idle_interval: float = 0.05,
        watch_config: bool = False,
        cpu_slots: int | None = None,
        sidecar: Sidecar | None = None,
    ) -> None:
        self.lab_dir = lab_dir
        self.config = config
        self.ledger = ledger
        self.slots = slots
        self.backends = backends
        for backend in backends.values():
            backend.use_ledger(ledger)  # a backend never opens a ledger of its own
        self.policy = policy
        self.poll_interval = poll_interval
        self.idle_interval = idle_interval
        self.active: dict[str, _Active] = {}
        # queued retries of runs that ended `infra`: experiment id -> the worker it ended on, which
        # it leaves for another live worker of its tier (read from the ledger each heartbeat)
        self._retries: dict[str, str] = {}
        self.pid = os.getpid()
        self.stopping = False
        self._fingerprint = expected_fingerprint(config)
        self._val_set = expected_val_set(config)
        # built-in target: the harness scores every local run apart from train.py (harness/attempt.py)
        self._digests = None
        if config.target.builtin:
            from nightlab.harness.attempt import record_digests

            self._digests = record_digests(lab_dir)
        self._code: str | None = None
        self._next_backup = 0.0
        self._disk = DiskGate(lab_dir)
        self.ledger_failed = False
        self.health = HealthWatch(config.fleet, slots)
        # the daemon's controller follows the committed nightlab.toml: new pools, slots and
        # threads take effect without stopping running work (see `_follow_config`)
        self.watch_config = watch_config
        self.cpu_slots = cpu_slots
        self._config_blob = _config_blob(lab_dir) if watch_config else None
        # a helper process kept beside the controller (the trackers' worker); it reads the ledger
        # itself, so nothing of the loop ever waits on it
        self.sidecar = sidecar

    # ------------------------------------------------------------------ life cycle

    def run(self) -> None:
        self.ledger.claim_controller(self.pid, socket.gethostname())
        self.ledger.register_workers([(s.name, s.tier, s.backend, s.info) for s in self.slots])
        self._recover()
        last_beat = 0.0
        last_activity = time.time()
        try:
            while True:
                self._maybe_backup()
                now = time.time()
                if now - last_beat >= HEARTBEAT_SECONDS:
                    if not self.ledger.controller_heartbeat(self.pid):
                        self.stopping = True
                    self.ledger.heartbeat(a.attempt.id for a in self.active.values())
                    self._retries = self.ledger.infra_retries()
                    self.health.sample()
                    if self.watch_config:
                        self._follow_config()
                    if self.sidecar is not None:
                        self.sidecar.sync(self.config)
                    last_beat = now
                if self.stopping:
                    break
                # free slots are refilled before the ended runs are recorded: the next
                # process starts without waiting for log parsing and verdicts
                ended = self._poll_active()
                queued = self._dispatch()
                for active, result in ended:
                    self._record(active, result)
                if self.active or queued:
                    last_activity = now
                elif now - last_activity > self.config.fleet.idle_shutdown:
                    log.info("idle for %.0f s: exiting", now - last_activity)
                    break
                time.sleep(self.poll_interval if self.active else self.idle_interval)
        except LedgerError as e:
            # the ledger cannot be written (full disk, I/O error): the runs go on by themselves and the
            # next controller re-attaches them, so leave them alone and say why in one line
            log.error("%s; the controller stops and leaves its runs for the next one", e)
            self.ledger_failed = True
            raise
        finally:
            self._shutdown()

    def _maybe_backup(self) -> None:
        """Take an online backup of the ledger when the last one is `fleet.backup_interval` old."""
        from nightlab.ledger import backup

        now = time.time()
        if now < self._next_backup:
            return
        self._next_backup = now + self.config.fleet.backup_interval
        if not backup.backup_due(self.ledger.path, interval=self.config.fleet.backup_interval, now=now):
            return
        try:
            path = backup.take_backup(self.ledger.path, keep=self.config.fleet.backups)
        except LedgerError as e:  # a failed backup must not stop the night's runs
            log.error("%s", e)
            return
        log.info("ledger backed up to %s", path)

    def request_stop(self, *_: object) -> None:
        self.stopping = True

    def _follow_config(self) -> None:
        """Take up a newly committed nightlab.toml: its pools, slots and threads, its timeout.

        Running attempts keep their slot (one that left the config is watched to its end and
        then gets no more work). A config that does not parse, or whose local slots would
        oversubscribe the machine, is logged and ignored: the fleet keeps the last good one.
        """
        blob = _config_blob(self.lab_dir)
        if blob == self._config_blob:
            return
        self._config_blob = blob
        from nightlab.config import load_lab_config
        from nightlab.fleet.capacity import check_capacity

        try:
            config = load_lab_config(self.lab_dir).config
            check_capacity(config, cpu_slots=self.cpu_slots)
            slots, backends = build_slots(config, cpu_slots=self.cpu_slots, lab_dir=self.lab_dir)
        except NightlabError as e:
            log.warning("the committed nightlab.toml is not taken up: %s", e)
            self.ledger.log_event("config-refused", None, error=str(e))
            return
        for kind, backend in backends.items():
            if kind in self.backends:
                backend.close()
            else:
                backend.use_ledger(self.ledger)
                self.backends[kind] = backend
        self.config, self.slots = config, slots
        self._fingerprint = expected_fingerprint(config)
        self._val_set = expected_val_set(config)
        self.health.update_slots(slots, config.fleet)
        self.ledger.register_workers([(s.name, s.tier, s.backend, s.info) for s in slots])
        for active in self.active.values():
            self.ledger.set_worker(
                active.slot.name, state=WorkerState.BUSY, experiment_id=active.attempt.experiment_id
            )
        log.info(
            "took up the committed nightlab.toml: %d slots (%s)", len(slots), ", ".join(config.fleet.tiers)
        )
        self.ledger.log_event("config-reload", None, slots=len(slots), tiers=config.fleet.tiers)

    def _shutdown(self) -> None:
        if self.sidecar is not None:
            self.sidecar.stop()
        if self.ledger_failed:
            # the controller row stays on purpose: the next CLI call sees a dead controller and
            # starts one, which re-attaches these runs once the ledger can be written again
            for backend in self.backends.values():
                backend.close()
            return
        # runs that we kill here did nothing wrong: they go back to the queue
        for active in list(self.active.values()):
            self._backend(active.slot).kill(active.slot, active.spec, active.handle)
            # one more attempt than this one: a stop is not the run's fault, so it uses up no retry
            self._finish(
                active.attempt,
                outcome=Outcome.INFRA,
                detail="the controller was stopped; requeued",
                max_attempts=active.attempt.number + 1,
                worker_state=WorkerState.STOPPED,
            )
            self._backend(active.slot).cleanup(active.spec)
        self.active.clear()
        self.health.close()
        for backend in self.backends.values():
            backend.close()
        self.ledger.release_controller(self.pid)

    # ------------------------------------------------------------------ helpers

    def _expected_code(self) -> str:
        """The code hash of this controller's nightlab (what remote workers must report)."""
        if self._code is None:
            from nightlab.fleet.build import code_hash

            self._code = code_hash()
        return self._code

    def _backend(self, slot: WorkerSlot) -> BaseBackend:
        return self.backends[slot.backend]

    def _spec(self, attempt: Attempt) -> RunSpec:
        exp = self.ledger.get(attempt.experiment_id)
        run_dir = self.lab_dir / ".nightlab" / "runs" / exp.id / f"attempt-{attempt.number}"
        env = {
            "NIGHTLAB_EXPERIMENT": exp.id,
            "NIGHTLAB_SEED": str(exp.seed),
            "NIGHTLAB_TIER": exp.tier,
            "NIGHTLAB_WORKER": attempt.worker,
            "NIGHTLAB_LAB": str(self.lab_dir),
        }
        budget = tier_budget_env(self.config, exp.tier)
        if budget is not None:  # the harness's supervisor runs the clock for the tier's budget
            env[BUDGET_ENV] = budget
        command = self.config.target.command
        backend = attempt.handle.get("backend", "local")
        if self._scored(backend) and backend == "local":
            from nightlab.harness.attempt import HARNESS_DIGESTS_ENV, wrap_command

            command = wrap_command(command, run_dir=run_dir, lab_dir=self.lab_dir)
            env[HARNESS_DIGESTS_ENV] = str(self._digests)
        elif self._scored(backend):
            # a remote worker wraps the command itself, with its own paths (fleet/templates/run.sh);
            # its digests are its wheel's RECORD, and its code hash must be the controller's
            env["NIGHTLAB_SUPERVISE"] = "1"
        return RunSpec(
            experiment_id=exp.id,
            attempt=attempt.number,
            snapshot=exp.snapshot,
            command=command,
            env=env,
            timeout=self.config.target.timeout,
            run_dir=run_dir,
            lab_dir=self.lab_dir,
        )

    def _scored(self, backend: str) -> bool:
        """Whether the harness scores runs on this backend: built-in target, local or skypilot."""
        return self._digests is not None and backend in ("local", "skypilot")

    def _flag_seed(self, experiment_id: str, metrics: dict[str, Any]) -> dict[str, Any]:
        """Add `seed_warning` when another seed of the same snapshot scored exactly the same."""
        from nightlab.harness.owned import seed_ignored

        exp = self.ledger.get(experiment_id)
        name = self.config.metric.name
        siblings = [
            (o.seed, o.metric(name))
            for o in self.ledger.experiments(identity=exp.identity, tier=exp.tier)
            if o.id != exp.id and o.ok
        ]
        warning = seed_ignored(exp.seed, metrics[name], siblings)
        return {**metrics, "seed_warning": warning} if warning and "seed_warning" not in metrics else metrics

    def _slot_for(self, attempt: Attempt) -> WorkerSlot:
        for slot in self.slots:
            if slot.name == attempt.worker:
                return slot
        # the worker left the config while its run was alive: watch it under its old name
        backend = attempt.handle.get("backend", "local")
        if backend not in self.backends:
            if backend != "local":
                raise NightlabError(
                    f"attempt {attempt.experiment_id}/{attempt.number} runs on backend `{backend}`, which "
                    "nightlab.toml no longer configures; restore its [[fleet.pool]] to recover it"
                )
            self.backends[backend] = LocalBackend()
        return WorkerSlot(
            name=attempt.worker, tier=self.ledger.get(attempt.experiment_id).tier, backend=backend
        )

    def _recover(self) -> None:
        busy = set()
        for attempt in self.ledger.open_attempts():
            slot = self._slot_for(attempt)
            spec = self._spec(attempt)
            key = slot.name if slot.name not in busy else f"{slot.name}#{attempt.id}"
            busy.add(slot.name)
            deadline = attempt.started_at + spec.timeout + self._backend(slot).start_patience(slot, spec)
            self.active[key] = _Active(slot, attempt, spec, attempt.handle, deadline)
            self.health.watch(attempt, slot, attempt.handle)
            self.ledger.set_worker(slot.name, state=WorkerState.BUSY, experiment_id=attempt.experiment_id)
            self.ledger.log_event("reattach", attempt.experiment_id, worker=slot.name, attempt=attempt.number)

    # ------------------------------------------------------------------ the two halves of a turn

    def _poll_active(self) -> list[tuple[_Active, RunExit]]:
        """Enforce deadlines and cancellations; return (and release the slots of) the runs that ended."""
        ended_runs = []
        cancel = self.ledger.cancel_requests() if self.active else set()
        now = time.time()
        for key, active in list(self.active.items()):
            backend = self._backend(active.slot)
            # poll before enforcing the deadline: a run that ended by itself while no controller
            # watched (a restart after a crash) has a real result, not a timeout
            try:
                ended = backend.poll(active.slot, active.spec, active.handle)
            except NightlabError as e:
                ended = RunExit(None, lost=True, detail=str(e))
            if ended is None and not active.started:
                started = backend.started(active.slot, active.spec, active.handle)
                if started is not None:  # the budget counts from the start, not from the lease
                    active.started, active.deadline = True, started + active.spec.timeout
            if ended is None and active.killed is None:
                if now > active.deadline:
                    late = not active.started and backend.start_patience(active.slot, active.spec) > 0
                    active.killed, active.killed_at = _Kill.UNSTARTED if late else _Kill.TIMEOUT, now
                    backend.kill(active.slot, active.spec, active.handle)
                elif active.spec.experiment_id in cancel:
                    active.killed, active.killed_at = _Kill.CANCELLED, now
                    backend.kill(active.slot, active.spec, active.handle)
            if ended is None and active.killed and now - active.killed_at > KILL_GRACE_SECONDS:
                ended = RunExit(None, lost=True, detail="did not exit after being killed")
            if ended is not None and active.killed is _Kill.UNSTARTED:
                ended = RunExit(
                    None, lost=True, detail=f"did not start within {now - active.attempt.started_at:.0f} s"
                )
            if ended is not None:
                ended_runs.append((active, ended))
                del self.active[key]
        return ended_runs

    def _record(self, active: _Active, ended: RunExit) -> None:
        tail = read_tail(active.spec.log_path)
        if active.killed is _Kill.CANCELLED:
            outcome, detail, metrics = Outcome.CANCELLED, "cancelled by the user", {}
        else:
            result = classify(
                ended.exit_code,
                tail,
                metric=self.config.metric.name,
                timed_out=active.killed is _Kill.TIMEOUT,
                lost=ended.lost,
                expected_fingerprint=self._fingerprint,
                max_training_seconds=max_training_seconds(self.config, active.slot.tier),
                code=ended.code,
                expected_code=self._expected_code() if ended.code else None,
            )
            # for an infra end the backend knows best what happened (e.g. which cluster went down)
            first, second = (
                (ended.detail, result.detail)
                if result.outcome is Outcome.INFRA
                else (result.detail, ended.detail)
            )
            outcome, detail, metrics = result.outcome, first or second, result.metrics
            if self._scored(active.slot.backend):
                from nightlab.harness.owned import apply_score, read_score

                score = read_score(active.spec.run_dir)
                scored, detail, metrics = apply_score(
                    outcome,
                    detail,
                    metrics,
                    score,
                    metric=self.config.metric.name,
                    expected_val_set=self._val_set,
                )
                outcome = Outcome(scored)  # the harness speaks in the stored strings
                if outcome is Outcome.OK:
                    metrics = self._flag_seed(active.spec.experiment_id, metrics)
            if (outcome.is_crash() or outcome is Outcome.INFRA) and disk_full(active.spec.run_dir, tail):
                # the run could not write its log: not the code's fault, so retry it when there is room
                outcome, detail = Outcome.INFRA, disk_full_detail(active.spec.run_dir)
        health = self.health.finish(active.attempt, reported=ended.health)
        if health is not None and health.degraded and health_may_judge(outcome, metrics):
            outcome, detail = Outcome.DEGRADED, health.reason
        state, exp = self._finish(
            active.attempt,
            outcome=outcome,
            exit_code=ended.exit_code,
            detail=detail,
            metrics=metrics,
            health=health.to_dict() if health is not None else None,
        )
        trim_log(active.spec.log_path)
        if state is AttemptEnd.FINISHED and outcome is Outcome.DEGRADED:
            self.health.rerun(self.ledger, self.lab_dir, exp, active.slot)
        self._backend(active.slot).cleanup(active.spec)

    def _finish(
        self,
        attempt: Attempt,
        *,
        outcome: Outcome,
        detail: str | None,
        exit_code: int | None = None,
        metrics: dict[str, Any] | None = None,
        health: dict[str, Any] | None = None,
        max_attempts: int | None = None,
        worker_state: WorkerState = WorkerState.IDLE,
    ) -> tuple[AttemptEnd | None, Experiment]:
        """End an attempt that ran, could not start or was stopped with the controller; a final end
        carries the policy's verdict.

        One path for all, so a refused launch and a run that says it is invalid are judged alike.
        `infra` is retried while attempts are left (`max_attempts`, by default 1 + the fleet's
        retries) and nobody asked to cancel the run: `Outcome.is_final`, the ledger's rule too.
        Returns the experiment's new state and the experiment as it was before this end.
        """
        exp = self.ledger.get(attempt.experiment_id)
        max_attempts = max_attempts or 1 + self.config.fleet.retries
        final = outcome.is_final(
            attempts=exp.attempts, max_attempts=max_attempts, cancel_requested=exp.cancel_requested
        )
        value = (metrics or {}).get(self.config.metric.name)
        judge = final and outcome is not Outcome.CANCELLED  # a cancelled run says nothing about its idea
        verdict, judged = self.policy.end(exp, outcome, value) if judge else (None, None)
        state = self.ledger.finish_attempt(
            attempt.id,
            outcome=outcome,
            exit_code=exit_code,
            detail=detail,
            metrics=metrics,
            max_attempts=max_attempts,
            worker_state=worker_state,
            verdict=verdict,
            judged=judged,
            health=health,
        )
        if state is AttemptEnd.FINISHED:
            self.policy.ended(exp, outcome, verdict, judged)
        elif state is AttemptEnd.QUEUED:
            self._retries[exp.id] = attempt.worker  # before the next lease, not at the next heartbeat
        return state, exp

    def _dispatch(self) -> bool:
        """Lease work to free slots; returns whether anything is queued for this fleet."""
        free = self._free_slots()
        queued = self._queued_by_tier()
        if free and any(queued.values()) and self._disk.full():
            return True  # a run started now would die writing its log: wait in the queue for space
        for slot, retry_only in free:
            if not queued.get(slot.tier) or not self._backend(slot).available(slot):
                continue
            allowed, skip = self.health.lease_rule(slot, [a.slot for a in self.active.values()])
            if not allowed:
                continue
            avoid = self._left_by(slot)
            only = self._retries_for(slot) if retry_only else None
            attempt = self.ledger.lease_next(
                slot.name, slot.tier, handle={"backend": slot.backend}, skip=[*skip, *avoid], only=only
            )
            if attempt is None:
                if not skip and not avoid and only is None:  # else only what this slot skips may be left
                    queued[slot.tier] = 0
                continue
            self._retries.pop(attempt.experiment_id, None)
            queued[slot.tier] -= 1
            spec = self._spec(attempt)
            try:
                handle = {"backend": slot.backend, **self._backend(slot).launch(slot, spec)}
            except NightlabError as e:
                self._finish(attempt, outcome=Outcome.INVALID, detail=f"could not launch: {e}")
                continue
            except OSError as e:  # the machine's fault (a full disk while materialising), not the code's
                self._finish(attempt, outcome=Outcome.INFRA, detail=f"could not launch: {e}")
                continue
            self.ledger.update_attempt(attempt.id, handle=handle, log_path=str(spec.log_path))
            self.health.watch(attempt, slot, handle)
            deadline = time.time() + spec.timeout + self._backend(slot).start_patience(slot, spec)
            key = slot.name if slot.name not in self.active else f"{slot.name}#{attempt.id}"
            self.active[key] = _Active(slot, attempt, spec, handle, deadline)
        return any(queued.get(t) for t in {s.tier for s in self.slots})

    def _free_slots(self) -> list[tuple[WorkerSlot, bool]]:
        """Slots that may lease, each with whether it may take only a retry from another worker.

        Free: slots without a run, and pipelined slots with room in their queue (`queue_depth`).
        A pipelined slot whose queue is full takes one more, but only a retry of a run that
        ended `infra` on another worker of its tier: that run must not wait for its own worker.
        """
        runs: dict[str, list[_Active]] = {}
        for active in self.active.values():
            runs.setdefault(active.slot.name, []).append(active)
        free = []
        for s in self.slots:
            held = runs.get(s.name, [])
            depth = self._backend(s).queue_depth(s) if held else 0
            waiting = sum(not a.started for a in held)
            if not held or (waiting < depth and len(held) <= depth):
                free.append((s, False))
            elif depth and waiting <= depth and len(held) <= depth + 1 and self._retries_for(s):
                free.append((s, True))
        return free

    def _retries_for(self, slot: WorkerSlot) -> list[str]:
        """Queued retries of runs that ended `infra` on another worker of `slot`'s tier."""
        others = {s.name for s in self.slots if s.tier == slot.tier and s.name != slot.name}
        return [eid for eid, worker in self._retries.items() if worker in others]

    def _left_by(self, slot: WorkerSlot) -> list[str]:
        """The retries `slot` must not take: those that ended `infra` on it, while its tier has
        another live worker (one whose backend offers it work), which then takes them."""
        mine = [eid for eid, worker in self._retries.items() if worker == slot.name]
        if mine and any(
            s.tier == slot.tier and s.name != slot.name and self._backend(s).available(s) for s in self.slots
        ):
            return mine
        return []

    def _queued_by_tier(self) -> dict[str, int]:
        return self.ledger.queued_counts()
