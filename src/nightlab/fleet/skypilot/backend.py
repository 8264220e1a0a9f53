"""SkyPilotBackend: the backend interface over the cluster half and the job half.

`launch` queues the attempt and returns at once; a thread waits for the cluster to be up
and submits `sky.exec` with the snapshot inside the job (`fleet/sky_task.py`). `poll` only
reads cached state, so no network call ever blocks the controller's loop. The state
machines live in `clusters.py` and `jobs.py`; this class wires them to `BaseBackend` and
writes their events to the ledger on the caller's thread (`core.Shared`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nightlab.config import LabConfig, slots_per_cluster
from nightlab.errors import NightlabError
from nightlab.fleet.backend import BaseBackend, RunExit, RunSpec, WorkerSlot
from nightlab.fleet.cluster_states import ClusterEvent, ClusterState
from nightlab.fleet.sky_task import _sky, experiment_task, job_name
from nightlab.fleet.skypilot import core
from nightlab.fleet.skypilot.clusters import Cluster, Clusters
from nightlab.fleet.skypilot.core import (
    Shared,
    cluster_workers,
    field_of,
    is_gone,
    lab_hash,
    lane_cpus,
    lane_of,
    log,
    queue_depth,
    skypilot_slots,
)
from nightlab.fleet.skypilot.jobs import Jobs, Run

if TYPE_CHECKING:
    from nightlab.ledger import Ledger


class SkyPilotBackend(BaseBackend):
    """Runs attempts on SkyPilot clusters (see the package docstring).

    Args:
        config: the lab's config; its skypilot pools define the workers.
        lab_dir: the lab (for the worker YAML, snapshots and run dirs); learned from the
            first attempt when not given.
        ledger: where cluster events go, written only on the thread that calls this
            backend's methods (a `Ledger` belongs to one thread); None = only logged.
            The controller hands its own over with `use_ledger`.
        sdk: what the SDK calls go through; the `sky` module by default, a
            `nightlab.testing.fake_sky.FakeSky` in tests and benchmarks.
        status_interval: seconds between job-status polls (default `core.STATUS_INTERVAL`).
        log_retries, retry_delay: log reading retries and the first backoff.
        relaunch_backoff: seconds before relaunching a cluster whose launch failed.
    """

    name = "skypilot"

    def __init__(
        self,
        config: LabConfig,
        *,
        lab_dir: Path | None = None,
        ledger: Ledger | None = None,
        sdk: Any = None,
        status_interval: float | None = None,
        log_retries: int | None = None,
        retry_delay: float | None = None,
        relaunch_backoff: float | None = None,
    ) -> None:
        self.config = config
        # None reads the module's constant now, so a test or benchmark can rescale them
        self.shared = Shared(
            sdk if sdk is not None else _sky(),
            lab_dir=lab_dir.resolve() if lab_dir else None,
            status_interval=core.STATUS_INTERVAL if status_interval is None else status_interval,
            log_retries=core.LOG_RETRIES if log_retries is None else log_retries,
            retry_delay=core.RETRY_DELAY if retry_delay is None else retry_delay,
        )
        # one cluster per worker (`pools`, by its worker name); one or more slots (lanes) on each
        self.pools = {
            worker: pool
            for pool in config.fleet.pools
            if pool.backend == "skypilot"
            for worker in cluster_workers(pool)
        }
        self.lanes = {
            slot.name: lane_of(slot)
            for pool in config.fleet.pools
            if pool.backend == "skypilot"
            for slot in skypilot_slots(pool)
        }
        backoff = core.RELAUNCH_BACKOFF if relaunch_backoff is None else relaunch_backoff
        self.clusters = Clusters(self.shared, config, self.pools, relaunch_backoff=backoff)
        self.jobs = Jobs(self.shared, self.clusters)
        self.clusters.before_launch = self.jobs.residents.clear_for_launch
        if ledger is not None:
            self.use_ledger(ledger)

    @property
    def sdk(self) -> Any:
        return self.shared.sdk

    @property
    def lab_dir(self) -> Path | None:
        return self.shared.lab_dir

    def use_ledger(self, ledger: Ledger) -> None:
        """Record cluster events in `ledger` (the caller's, used on the caller's thread only)."""
        self.shared.use_ledger(ledger)

    def cluster(self, worker: str) -> Cluster:
        """The worker's cluster as this backend sees it."""
        self._need_lab()
        return self.clusters.get(worker)

    # ------------------------------------------------------------------ BaseBackend

    def available(self, slot: WorkerSlot) -> bool:
        """Whether the slot's cluster is up; starts checking or launching it when it is not."""
        self.shared.flush()
        if self.lab_dir is None:
            return True  # cluster names need the lab: the first launch learns it and waits
        cluster, lane = self._cluster(slot)
        self.jobs.start()
        with self.shared.lock:
            up = cluster.state == ClusterState.UP
        if up:
            self.jobs.residents.ensure(cluster, lane)  # its lane's runner, before the first lease needs it
            return True
        self.clusters.ensure(cluster)
        return False

    def launch(self, slot: WorkerSlot, spec: RunSpec) -> dict[str, Any]:
        self._learn_lab(spec.lab_dir)
        cluster, lane = self._cluster(slot)
        task = experiment_task(
            spec,
            cluster.pool,
            lab_dir=self.lab_dir,
            slot_env=slot.env,
            cpus=lane_cpus(cluster.pool, cluster.cpus),
        )
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        run = self.jobs.add(spec, cluster, lane)
        self.jobs.start()
        self.shared.thread(self.jobs.submit, run, task)
        self.shared.flush()
        return {"cluster": cluster.name, "job_name": job_name(spec)}

    def poll(self, slot: WorkerSlot, spec: RunSpec, handle: dict[str, Any]) -> RunExit | None:
        self.shared.flush()
        run = self._run(slot, spec)
        with self.shared.lock:
            return run.ended

    def kill(self, slot: WorkerSlot, spec: RunSpec, handle: dict[str, Any]) -> None:
        self.jobs.request_kill(self._run(slot, spec))

    def started(self, slot: WorkerSlot, spec: RunSpec, handle: dict[str, Any]) -> float | None:
        """When the run script got the cluster (after `sky exec` and any job queued before it)."""
        run = self.jobs.get(spec)
        with self.shared.lock:
            return None if run is None else run.started_at

    def start_patience(self, slot: WorkerSlot, spec: RunSpec) -> float:
        """A run may wait for the runs ahead of it in the queue, plus a cluster relaunch."""
        return spec.timeout * max(1, self.queue_depth(slot)) + core.START_PATIENCE

    def queue_depth(self, slot: WorkerSlot) -> int:
        pool = self.pools.get(self.lanes.get(slot.name, (slot.name, 0))[0])
        return 0 if pool is None else queue_depth(pool)

    def cleanup(self, spec: RunSpec) -> None:
        self.jobs.forget(spec)

    def close(self) -> None:
        self.shared.stop.set()
        self.clusters.wake_all()
        # a stopping controller kills its runs: see those cancels through, or the jobs would
        # hold their clusters while the requeued experiments wait behind them
        self.jobs.settle_kills(time.time() + core.CLOSE_GRACE)
        self.jobs.residents.close()
        self.shared.flush()

    def _run(self, slot: WorkerSlot, spec: RunSpec) -> Run:
        run = self.jobs.get(spec)
        if run is None:  # an attempt an earlier controller launched
            self._learn_lab(spec.lab_dir)
            cluster, lane = self._cluster(slot)
            run = self.jobs.reattach(spec, cluster, lane)
        return run

    def _cluster(self, slot: WorkerSlot) -> tuple[Cluster, int]:
        """The slot's cluster and its lane on it (0 on a one-slot cluster)."""
        worker, lane = self.lanes.get(slot.name, (slot.name, 0))
        return self.clusters.get(worker), lane

    # ------------------------------------------------------------------ fleet up / down

    def up(self, *, relaunch: bool = False, on_change: Any = None) -> list[dict[str, Any]]:
        """Launch every worker's cluster (those already up are kept unless `relaunch`) and wait.

        Args:
            relaunch: launch clusters that are up again too (reruns set-up, e.g. after
                editing `fleet/skypilot.yaml`).
            on_change: called with (worker, state, detail) whenever a cluster changes state.

        Returns:
            One dict per worker: worker, cluster, state, detail, gpu_name, hourly_price.
        """
        self._need_lab()
        self.clusters.on_change = on_change
        clusters = [self.clusters.get(w) for w in self.pools]
        self.clusters.check(clusters)
        for c in clusters:
            with self.shared.lock:
                launch = c.state != ClusterState.UP or relaunch
                if launch:
                    c.state, c.retry_at = ClusterState.LAUNCHING, 0.0
            self.clusters.notify(c)
            if launch:
                self.shared.thread(self.clusters.launch, c)
        for c in clusters:
            with c.changed:
                # wake each second to write the launches' events on this (the ledger's) thread
                while not c.changed.wait_for(
                    lambda c=c: (
                        c.state in (ClusterState.UP, ClusterState.FAILED, ClusterState.DOWN)
                        or self.shared.stop.is_set()
                    ),
                    timeout=1.0,
                ):
                    self.shared.flush()
        residents = self.jobs.residents
        for c in clusters:
            for lane in range(slots_per_cluster(c.pool)):
                residents.ensure(c, lane)  # started now, a batch's first run does not wait for its runner
        for c in clusters:
            with residents.changed:
                while residents.starting(c) and not self.shared.stop.is_set():
                    residents.changed.wait(timeout=1.0)
                    self.shared.flush()
        self.shared.flush()
        return [{**c.view(), "runner": residents.view(c)} for c in clusters]

    def down(self) -> list[str]:
        """Tear down every cluster of this lab (the configured ones and leftovers); returns their names."""
        self._need_lab()
        sdk = self.sdk
        names = {self.clusters.get(w).name: w for w in self.pools}
        self.jobs.residents.close()  # their helpers reach into allocations about to go
        prefix = f"nl-{lab_hash(self.lab_dir)}-"
        try:
            for record in sdk.get(sdk.status(cluster_names=None)):
                name = field_of(record, "name")
                if name and name.startswith(prefix):
                    names.setdefault(name, name.removeprefix(prefix))
        except Exception as e:  # the listing is a courtesy: configured clusters go down anyway
            log.warning("could not list clusters: %s", e)
        requests = {}
        for name in names:
            try:
                requests[name] = sdk.down(name)
            except Exception as e:
                if not is_gone(e):
                    raise NightlabError(f"could not tear down cluster `{name}`: {e}") from e
        downed, errors = [], []
        for name, req in requests.items():
            try:
                sdk.get(req)
                downed.append(name)
            except Exception as e:
                if not is_gone(e):
                    errors.append(f"`{name}`: {e}")
                    continue
            self.shared.event(ClusterEvent.DOWN, names[name], {"cluster": name})
        self.jobs.residents.forget_records()
        self.shared.flush()
        if errors:
            raise NightlabError(
                f"could not tear down {len(errors)} cluster(s): {'; '.join(errors)}; "
                "retry `nightlab fleet down` or use `sky down`"
            )
        return sorted(downed)

    # ------------------------------------------------------------------ the lab

    def _learn_lab(self, lab_dir: Path) -> None:
        with self.shared.lock:
            if self.shared.lab_dir is None:
                self.shared.lab_dir = lab_dir.resolve()

    def _need_lab(self) -> None:
        if self.lab_dir is None:
            raise NightlabError("the SkyPilot backend needs the lab directory; pass `lab_dir`")
