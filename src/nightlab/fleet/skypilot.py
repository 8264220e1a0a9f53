"""SkyPilotBackend: each worker is one long-lived SkyPilot cluster; each attempt one `sky.exec`.

SkyPilot (https://docs.skypilot.co) launches, sets up, autostops and tears down clusters
on 20+ clouds, Kubernetes and Slurm; nightlab only decides what runs where. Written
against the SDK of `skypilot` 0.14 (the `nightlab[skypilot]` extra pins `>=0.14,<0.15`):
every call returns a request id that `sky.get` / `sky.stream_and_get` resolve.

Life of a worker cluster (`nl-<lab hash>-<worker>`): `nightlab fleet up` (or the first
experiment that needs it) runs `sky.launch` with the lab's `fleet/skypilot.yaml`, whose
setup installs nightlab and the target's dependencies and prepares the lab's data; the
cluster stops itself after `autostop` idle minutes, so a dead controller never leaves GPUs
billing; `nightlab fleet down` tears it down. Every change is an event in the ledger
(`cluster-launch`, `cluster-up`, `cluster-failed`, `cluster-lost`, `cluster-down`), which
is where `fleet status` and the cost report read them.

Life of an attempt: `launch` queues the attempt and returns at once; a thread waits for
the cluster to be up and submits `sky.exec` with the snapshot inside the job (see
`sky_task.py`); a thread per job streams its log (`sky.tail_logs(follow=True)`), which
returns the moment the job ends; one monitor thread polls `sky.job_status` of every running
job, which catches preemptions and broken streams, and then reads the log again with
retries. `poll` only reads that cached state, so no network call ever blocks the
controller's loop. A controller that restarts finds its jobs again by the id saved in
`run_dir/sky.json`, or by job name.

Failure mapping (the runner's classes):

    setup fails (FAILED_SETUP)         worker out of service (`cluster-failed`), not retried
                                       before `nightlab fleet up` or the next controller;
                                       no experiment is charged
    job fails with a traceback         crash:<class> from the log, like a local run
    cluster no longer up / preempted   infra: the experiment is requeued on another worker,
                                       and the cluster is relaunched when work needs it
    controller deadline reached        the job is cancelled (`sky.cancel`): timeout
    log cannot be read                 retried `log_retries` times with backoff, then infra

The controller should ask `available(slot)` before leasing to a slot: a cluster that is
launching, lost or failed is not offered work. A lease on such a slot anyway waits for
the cluster (and relaunches it) instead of failing.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nightlab.config import LabConfig, PoolConfig
from nightlab.errors import NightlabError, UsageError
from nightlab.fleet.backend import BaseBackend, RunExit, RunSpec, WorkerSlot
from nightlab.fleet.build import Wheel, build_wheel
from nightlab.fleet.costs import hourly_price
from nightlab.fleet.runner import read_tail
from nightlab.fleet.sky_task import (
    WHEEL_DIR,
    JobLogSink,
    _sky,
    check_pool,
    clean_job_log,
    cluster_task,
    experiment_task,
    job_name,
    load_worker_config,
    pip_override,
    run_keys,
)

log = logging.getLogger("nightlab.skypilot")

STATUS_INTERVAL = 5.0  # seconds between job-status polls; a 5-minute run loses at most this much
LOG_RETRIES = 3  # tries to read a finished job's log before the attempt becomes `infra`
STATUS_PATIENCE = 600.0  # seconds of unreadable job status (API server down) before giving a run up
RETRY_DELAY = 2.0  # first backoff between those tries (doubles)
RELAUNCH_BACKOFF = 300.0  # wait after a failed launch (no capacity) before trying again
DEFAULT_AUTOSTOP = 10  # idle minutes before a cluster stops itself
CLOSE_GRACE = 10.0  # seconds `close` waits for cancels in flight
_TERMINAL = {"SUCCEEDED", "FAILED", "FAILED_SETUP", "FAILED_DRIVER", "CANCELLED"}
_EXIT_STATUS = {0: "SUCCEEDED", 100: "FAILED", 103: "CANCELLED"}  # sky.exceptions.JobExitCode
_GONE = ("ClusterNotUpError", "ClusterDoesNotExist")
_STDOUT_LOCK = threading.Lock()


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


def lab_hash(lab_dir: Path) -> str:
    """Six hex digits naming the lab on the SkyPilot API server (clusters of two labs never clash)."""
    return hashlib.sha1(str(lab_dir.resolve()).encode()).hexdigest()[:6]


def cluster_name(lab_dir: Path, worker: str) -> str:
    return f"nl-{lab_hash(lab_dir)}-{_slug(worker)}"


def autostop_minutes(pool: PoolConfig) -> int | None:
    """Idle minutes before the pool's clusters stop themselves; None where SkyPilot cannot autostop.

    SkyPilot 0.14 refuses autostop on Slurm except for container clusters (Pyxis): a Slurm
    allocation ends at its time limit instead (`slurm.sbatch_options.time`, docs/skypilot.md).
    """
    if "autostop" in pool.options:
        return int(pool.options["autostop"])
    infra = str(pool.options.get("infra", ""))
    return None if infra.startswith("slurm") else DEFAULT_AUTOSTOP


def skypilot_slots(pool: PoolConfig) -> list[WorkerSlot]:
    """One worker slot per cluster of a skypilot pool (`workers = N`)."""
    check_pool(pool)
    infra = pool.options.get("infra")
    where = _slug(str(infra).split("/")[0]) if infra else "sky"
    info = {k: pool.options[k] for k in ("accelerators", "infra", "use_spot") if k in pool.options}
    return [
        WorkerSlot(name=f"{pool.tier}-{where}-{i}", tier=pool.tier, backend="skypilot", info=dict(info))
        for i in range(pool.slots)
    ]


def _status_name(status: Any) -> str | None:
    return None if status is None else str(getattr(status, "value", status))


def _is_gone(error: BaseException) -> bool:
    return type(error).__name__ in _GONE


@dataclass
class _Cluster:
    worker: str
    name: str
    pool: PoolConfig
    state: str = "unknown"  # unknown | checking | down | launching | up | failed
    detail: str | None = None
    retry_at: float = 0.0
    gpu_name: str | None = None
    software: dict[str, str | None] = field(default_factory=dict)  # nightlab version + code, torch
    hourly_price: float | None = None
    changed: threading.Condition = field(default_factory=threading.Condition)


@dataclass
class _Run:
    key: str
    spec: RunSpec
    cluster: _Cluster
    job_id: int | None = None
    state: str = "waiting"  # waiting | running | fetching | done
    ended: RunExit | None = None
    kill_requested: bool = False
    unreadable_since: float | None = None  # when its job status last became unreadable


class SkyPilotBackend(BaseBackend):
    """Runs attempts on SkyPilot clusters (see the module docstring).

    Args:
        config: the lab's config; its skypilot pools define the workers.
        lab_dir: the lab (for the worker YAML, snapshots and ledger events); learned from the
            first attempt when not given.
        sdk: what the SDK calls go through; the `sky` module by default, a
            `nightlab.testing.fake_sky.FakeSky` in tests and benchmarks.
        status_interval: seconds between job-status polls (default `STATUS_INTERVAL`).
        log_retries, retry_delay: log reading retries and the first backoff.
        relaunch_backoff: seconds before relaunching a cluster whose launch failed.
    """

    name = "skypilot"

    def __init__(
        self,
        config: LabConfig,
        *,
        lab_dir: Path | None = None,
        sdk: Any = None,
        status_interval: float | None = None,
        log_retries: int | None = None,
        retry_delay: float | None = None,
        relaunch_backoff: float | None = None,
    ) -> None:
        self.config = config
        self.sdk = sdk if sdk is not None else _sky()
        # None reads the module's constant now, so a test or benchmark can rescale them
        self.status_interval = STATUS_INTERVAL if status_interval is None else status_interval
        self.log_retries = LOG_RETRIES if log_retries is None else log_retries
        self.retry_delay = RETRY_DELAY if retry_delay is None else retry_delay
        self.relaunch_backoff = RELAUNCH_BACKOFF if relaunch_backoff is None else relaunch_backoff
        self.pools = {
            slot.name: pool
            for pool in config.fleet.pools
            if pool.backend == "skypilot"
            for slot in skypilot_slots(pool)
        }
        self.lab_dir = lab_dir.resolve() if lab_dir else None
        self._lock = threading.RLock()
        self._clusters: dict[str, _Cluster] = {}
        self._runs: dict[str, _Run] = {}
        self._pending_events: list[tuple[str, str, dict[str, Any]]] = []
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None
        self._on_change: Any = None
        self._cancels: list[threading.Thread] = []
        self._wheel: Wheel | None = None

    def _build(self) -> Wheel | None:
        """The controller's own nightlab as a wheel, built once (None when the YAML overrides it)."""
        with self._lock:
            if self._wheel is None and pip_override(load_worker_config(self.lab_dir)) is None:
                self._wheel = build_wheel(self.lab_dir / WHEEL_DIR)
            return self._wheel

    # ------------------------------------------------------------------ BaseBackend

    def available(self, slot: WorkerSlot) -> bool:
        """Whether the slot's cluster is up; starts checking or launching it when it is not."""
        if self.lab_dir is None:
            return True  # cluster names need the lab: the first launch learns it and waits
        cluster = self._cluster(slot.name)
        self._start()
        with self._lock:
            if cluster.state == "up":
                return True
        self._ensure(cluster)
        return False

    def launch(self, slot: WorkerSlot, spec: RunSpec) -> dict[str, Any]:
        self._learn_lab(spec.lab_dir)
        cluster = self._cluster(slot.name)
        task = experiment_task(spec, cluster.pool, lab_dir=self.lab_dir)
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        run = _Run(_key(spec), spec, cluster)
        with self._lock:
            self._runs[run.key] = run
        self._start()
        self._thread(self._submit, run, task)
        return {"cluster": cluster.name, "job_name": job_name(spec)}

    def poll(self, slot: WorkerSlot, spec: RunSpec, handle: dict[str, Any]) -> RunExit | None:
        with self._lock:
            run = self._runs.get(_key(spec))
        if run is None:
            run = self._reattach(slot, spec)
        with self._lock:
            return run.ended

    def kill(self, slot: WorkerSlot, spec: RunSpec, handle: dict[str, Any]) -> None:
        with self._lock:
            run = self._runs.get(_key(spec))
        if run is None:
            run = self._reattach(slot, spec)
        with self._lock:
            if run.kill_requested or run.ended is not None:
                return
            run.kill_requested = True
            job_id = run.job_id
        with run.cluster.changed:
            run.cluster.changed.notify_all()  # a run waiting for its cluster gives up now
        if job_id is not None:
            self._cancels.append(self._thread(self._cancel, run))

    def cleanup(self, spec: RunSpec) -> None:
        with self._lock:
            self._runs.pop(_key(spec), None)

    def close(self) -> None:
        self._stop.set()
        for cluster in list(self._clusters.values()):
            with cluster.changed:
                cluster.changed.notify_all()
        # a stopping controller kills its runs: let those cancels reach SkyPilot, or the jobs
        # would hold their clusters while the requeued experiments wait behind them
        deadline = time.time() + CLOSE_GRACE
        for thread in self._cancels:
            thread.join(max(0.0, deadline - time.time()))

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
        self._on_change = on_change
        clusters = [self._cluster(w) for w in self.pools]
        self._check_clusters(clusters)
        for c in clusters:
            with self._lock:
                launch = c.state != "up" or relaunch
                if launch:
                    c.state, c.retry_at = "launching", 0.0
            self._notify(c)
            if launch:
                self._thread(self._launch_cluster, c)
        for c in clusters:
            with c.changed:
                c.changed.wait_for(lambda c=c: c.state in ("up", "failed", "down") or self._stop.is_set())
        return [self._view(c) for c in clusters]

    def down(self) -> list[str]:
        """Tear down every cluster of this lab (the configured ones and leftovers); returns their names."""
        self._need_lab()
        names = {self._cluster(w).name: w for w in self.pools}
        prefix = f"nl-{lab_hash(self.lab_dir)}-"
        try:
            for record in self.sdk.get(self.sdk.status(cluster_names=None)):
                name = _field(record, "name")
                if name and name.startswith(prefix):
                    names.setdefault(name, name.removeprefix(prefix))
        except Exception as e:  # the listing is a courtesy: configured clusters go down anyway
            log.warning("could not list clusters: %s", e)
        requests = {}
        for name in names:
            try:
                requests[name] = self.sdk.down(name)
            except Exception as e:
                if not _is_gone(e):
                    raise NightlabError(f"could not tear down cluster `{name}`: {e}") from e
        downed, errors = [], []
        for name, req in requests.items():
            try:
                self.sdk.get(req)
                downed.append(name)
            except Exception as e:
                if not _is_gone(e):
                    errors.append(f"`{name}`: {e}")
                    continue
            self._event("cluster-down", names[name], {"cluster": name})
        self._flush_events()
        if errors:
            raise NightlabError(
                f"could not tear down {len(errors)} cluster(s): {'; '.join(errors)}; "
                "retry `nightlab fleet down` or use `sky down`"
            )
        return sorted(downed)

    # ------------------------------------------------------------------ clusters

    def _learn_lab(self, lab_dir: Path) -> None:
        with self._lock:
            if self.lab_dir is None:
                self.lab_dir = lab_dir.resolve()

    def _need_lab(self) -> None:
        if self.lab_dir is None:
            raise NightlabError("the SkyPilot backend needs the lab directory; pass `lab_dir`")

    def _cluster(self, worker: str) -> _Cluster:
        with self._lock:
            cluster = self._clusters.get(worker)
            if cluster is None:
                pool = self.pools.get(worker)
                if pool is None:
                    raise NightlabError(
                        f"worker `{worker}` is in no skypilot pool of nightlab.toml; restore its [[fleet.pool]]"
                    )
                cluster = _Cluster(worker, cluster_name(self.lab_dir, worker), pool)
                self._clusters[worker] = cluster
            return cluster

    def _ensure(self, cluster: _Cluster) -> None:
        """Start whatever brings the cluster closer to up: a status check or a launch."""
        with self._lock:
            now = time.time()
            if cluster.state == "unknown":
                cluster.state = "checking"
                action = self._check_one
            elif cluster.state == "down" or (cluster.state == "failed" and now >= cluster.retry_at):
                cluster.state = "launching"
                action = self._launch_cluster
            else:
                return
        self._notify(cluster)
        self._thread(action, cluster)

    def _check_one(self, cluster: _Cluster) -> None:
        self._check_clusters([cluster])

    def _check_clusters(self, clusters: list[_Cluster]) -> None:
        """Ask SkyPilot which of the clusters are up (one request for all)."""
        try:
            refresh = _sky().StatusRefreshMode.AUTO  # refreshes clusters with autostop or spot
            records = self.sdk.get(self.sdk.status(cluster_names=[c.name for c in clusters], refresh=refresh))
        except Exception as e:
            log.warning("sky status failed: %s", e)
            records = []
        by_name = {_field(r, "name"): r for r in records}
        last = self._last_cluster_events()
        for c in clusters:
            record = by_name.get(c.name)
            # an UP cluster whose set-up failed or never finished (a launch interrupted by a
            # dying process) is not ready: it is launched again, which reruns set-up
            ready = last.get(c.worker) in (None, "cluster-up")
            up = record is not None and _status_name(_field(record, "status")) == "UP" and ready
            with self._lock:
                if c.state not in ("unknown", "checking"):
                    continue
                c.state = "up" if up else "down"
                if up and c.hourly_price is None:
                    c.hourly_price = hourly_price(
                        _field(record, "handle"), c.pool.options.get("hourly_price")
                    )
            self._notify(c)

    def _launch_cluster(self, cluster: _Cluster) -> None:
        pool = cluster.pool
        start = time.time()
        log_dir = self.lab_dir / ".nightlab" / "fleet" / cluster.name
        log_dir.mkdir(parents=True, exist_ok=True)
        launch_log = log_dir / "launch.log"
        self._event("cluster-launch", cluster.worker, {"cluster": cluster.name})
        try:
            task = cluster_task(
                self.lab_dir,
                pool,
                cluster=cluster.name,
                builtin=self.config.target.builtin,
                wheel=self._build(),
            )
            autostop = autostop_minutes(pool)
            infra = str(pool.options.get("infra", ""))
            # Kubernetes pods cannot be stopped, only deleted
            autodown = bool(pool.options.get("autodown", infra.startswith(("k8s", "kubernetes"))))
            # SkyPilot's client prints "Running on cluster: <name>" to stdout at launch, but stdout
            # carries nightlab's data (`fleet up --json`): its chatter goes to stderr. The
            # redirect is process-wide, so launches take turns (submitting one takes a moment).
            with _STDOUT_LOCK, contextlib.redirect_stdout(sys.stderr):
                request = self.sdk.launch(
                    task,
                    cluster_name=cluster.name,
                    idle_minutes_to_autostop=autostop,
                    down=autodown and autostop is not None,
                )
            with open(launch_log, "w") as out:
                job_id, handle = self.sdk.stream_and_get(request, output_stream=out)
            status = self._wait_job(cluster.name, job_id)
            setup = self._tail(cluster.name, job_id, io.StringIO)  # raw: SkyPilot's lines help here
        except Exception as e:
            reason = "no capacity" if type(e).__name__ == "ResourcesUnavailableError" else "launch failed"
            # a broken fleet/skypilot.yaml fails the same way every time: only `fleet up` retries it
            retry = not isinstance(e, UsageError)
            self._cluster_failed(cluster, f"{reason}: {_one_line(e)}", retry=retry, log_path=launch_log)
            return
        with open(launch_log, "a") as out:
            out.write(setup.getvalue())
        if status != "SUCCEEDED":
            # the cluster is up (and billing) until autostop ends it; costs.py counts that
            self._cluster_failed(
                cluster,
                f"set-up failed (job status {status})",
                retry=False,
                log_path=launch_log,
                provisioned=True,
            )
            return
        _, tags = clean_job_log(setup.getvalue())
        with self._lock:
            cluster.state, cluster.detail = "up", None
            cluster.gpu_name = tags.get("gpu") or None
            cluster.software = {k: tags.get(k) for k in ("version", "code", "torch")}
            cluster.hourly_price = hourly_price(handle, pool.options.get("hourly_price"))
        self._event(
            "cluster-up",
            cluster.worker,
            {
                "cluster": cluster.name,
                "setup_seconds": time.time() - start,
                "hourly_price": cluster.hourly_price,
                "gpu_name": cluster.gpu_name,
                "nightlab_version": cluster.software.get("version"),
                "nightlab_code": cluster.software.get("code"),
                "torch_version": cluster.software.get("torch"),
                "autostop_minutes": autostop_minutes(pool),
                "accelerators": pool.options.get("accelerators"),
                "infra": pool.options.get("infra"),
            },
        )
        self._notify(cluster)

    def _cluster_failed(
        self, cluster: _Cluster, detail: str, *, retry: bool, log_path: Path, provisioned: bool = False
    ) -> None:
        with self._lock:
            cluster.state, cluster.detail = "failed", detail
            cluster.retry_at = time.time() + self.relaunch_backoff if retry else float("inf")
        data = {"cluster": cluster.name, "detail": detail, "log": str(log_path), "provisioned": provisioned}
        self._event("cluster-failed", cluster.worker, data)
        log.warning("cluster %s: %s (log: %s)", cluster.name, detail, log_path)
        self._notify(cluster)

    def _cluster_down(self, cluster: _Cluster, detail: str) -> None:
        """Record that a cluster we thought up is not (preempted, stopped by autostop, deleted)."""
        with self._lock:
            was_up = cluster.state == "up"
            if was_up:
                cluster.state = "down"
        if was_up:
            self._event("cluster-lost", cluster.worker, {"cluster": cluster.name, "detail": detail})
        self._notify(cluster)

    def _cluster_lost(self, cluster: _Cluster, detail: str) -> None:
        """The cluster is no longer up: its running jobs end as `infra`; it relaunches when work needs it."""
        with self._lock:
            for run in self._runs.values():
                if run.cluster is cluster and run.state in ("running", "fetching"):
                    self._end(
                        run,
                        RunExit(
                            None, lost=True, detail=f"cluster `{cluster.name}` is no longer up ({detail})"
                        ),
                    )
        self._cluster_down(cluster, detail)

    def _cluster_is_up(self, cluster: _Cluster) -> bool | None:
        try:
            refresh = _sky().StatusRefreshMode.FORCE  # ask the cloud: is it really gone?
            records = self.sdk.get(self.sdk.status(cluster_names=[cluster.name], refresh=refresh))
        except Exception:
            return None  # cannot tell
        return any(
            _field(r, "name") == cluster.name and _status_name(_field(r, "status")) == "UP" for r in records
        )

    def _notify(self, cluster: _Cluster) -> None:
        with cluster.changed:
            cluster.changed.notify_all()
        if self._on_change is not None:
            self._on_change(cluster.worker, cluster.state, cluster.detail)

    def _view(self, cluster: _Cluster) -> dict[str, Any]:
        return {
            "worker": cluster.worker,
            "cluster": cluster.name,
            "state": cluster.state,
            "detail": cluster.detail,
            "gpu_name": cluster.gpu_name,
            "hourly_price": cluster.hourly_price,
        }

    # ------------------------------------------------------------------ attempts

    def _submit(self, run: _Run, task: Any) -> None:
        cluster = run.cluster
        for _ in range(2):  # a cluster found stopped (autostop) at exec time is relaunched once
            if not self._wait_up(run):
                return
            try:
                request = self.sdk.exec(task, cluster_name=cluster.name)
                self._save(run, request_id=str(request))
                job_id, _ = self.sdk.get(request)
                break
            except Exception as e:
                if not _is_gone(e):
                    detail = f"sky exec on `{cluster.name}` failed: {_one_line(e)}"
                    self._end(run, RunExit(None, lost=True, detail=detail))
                    return
                self._cluster_down(cluster, _one_line(e))
        else:
            self._end(run, RunExit(None, lost=True, detail=f"cluster `{cluster.name}` went down twice"))
            return
        self._running(run, int(job_id))

    def _running(self, run: _Run, job_id: int) -> None:
        """The run's job exists: record its id, stream its log, and cancel it if a kill came first."""
        with self._lock:
            run.job_id, run.state = job_id, "running"
            kill = run.kill_requested
        self._save(run, job_id=job_id)
        self._thread(self._follow, run)
        if kill:
            self._cancel(run)

    def _wait_up(self, run: _Run) -> bool:
        """Wait until the run's cluster is up (launching it when needed); False ends the run."""
        cluster = run.cluster
        with cluster.changed:
            while True:
                with self._lock:
                    state, kill = cluster.state, run.kill_requested
                    hopeless = state == "failed" and cluster.retry_at == float("inf")
                if kill or self._stop.is_set():
                    self._end(run, RunExit(None, detail="stopped before it started"))
                    return False
                if state == "up":
                    return True
                if hopeless:
                    detail = f"cluster `{cluster.name}`: {cluster.detail}"
                    self._end(run, RunExit(None, lost=True, detail=detail))
                    return False
                self._ensure(cluster)
                cluster.changed.wait(timeout=1.0)

    def _cancel(self, run: _Run) -> None:
        try:
            self.sdk.get(self.sdk.cancel(run.cluster.name, job_ids=[run.job_id]))
        except Exception as e:  # the job may have ended or its cluster gone: the monitor sees it
            log.info("cancel of job %s on %s: %s", run.job_id, run.cluster.name, e)

    def _reattach(self, slot: WorkerSlot, spec: RunSpec) -> _Run:
        """Take over an attempt an earlier controller launched."""
        self._learn_lab(spec.lab_dir)
        run = _Run(_key(spec), spec, self._cluster(slot.name))
        try:
            saved = json.loads((spec.run_dir / "sky.json").read_text())
        except (OSError, ValueError):
            saved = {}
        with self._lock:
            existing = self._runs.get(run.key)
            if existing is not None:
                return existing
            self._runs[run.key] = run
        self._start()
        if saved.get("job_id") is not None:
            self._running(run, int(saved["job_id"]))
        else:
            self._thread(self._find_job, run)
        return run

    def _find_job(self, run: _Run) -> None:
        """The job id of a run whose exec was in flight when the controller died, by job name."""
        name = job_name(run.spec)
        try:
            jobs = self.sdk.get(self.sdk.queue(run.cluster.name, skip_finished=False))
        except Exception as e:
            self._end(
                run,
                RunExit(None, lost=True, detail=f"cannot list jobs on `{run.cluster.name}`: {_one_line(e)}"),
            )
            return
        ids = [_field(j, "job_id") for j in jobs if _field(j, "job_name") == name]
        if not ids:
            self._end(
                run, RunExit(None, lost=True, detail=f"no job `{name}` on cluster `{run.cluster.name}`")
            )
            return
        self._running(run, int(max(ids)))

    def _save(self, run: _Run, **data: Any) -> None:
        path = run.spec.run_dir / "sky.json"
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            saved = {}
        saved.update(data, cluster=run.cluster.name)
        tmp = path.with_name(f".sky.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(saved))
        os.replace(tmp, path)

    def _end(self, run: _Run, ended: RunExit) -> None:
        with self._lock:
            if run.ended is None:
                run.ended, run.state = ended, "done"

    # ------------------------------------------------------------------ monitoring

    def _start(self) -> None:
        with self._lock:
            if self._monitor is None:
                self._monitor = threading.Thread(target=self._monitor_loop, name="sky-monitor", daemon=True)
                self._monitor.start()

    def _thread(self, target: Any, *args: Any) -> threading.Thread:
        # daemon threads: a launch blocked for minutes must not keep the controller from exiting
        thread = threading.Thread(target=self._guarded, args=(target, *args), daemon=True)
        thread.start()
        return thread

    def _guarded(self, target: Any, *args: Any) -> None:
        try:
            target(*args)
        except Exception:
            log.exception("SkyPilot backend thread %s failed", getattr(target, "__name__", target))

    def _monitor_loop(self) -> None:
        while not self._stop.wait(self.status_interval):
            try:
                self._check_jobs()
                self._flush_events()
            except Exception:
                log.exception("SkyPilot monitor turn failed")

    def _check_jobs(self) -> None:
        with self._lock:
            by_cluster: dict[str, list[_Run]] = {}
            for run in self._runs.values():
                if run.state == "running":
                    by_cluster.setdefault(run.cluster.name, []).append(run)
        requests = {}
        for name, runs in by_cluster.items():
            try:
                requests[name] = self.sdk.job_status(name, [r.job_id for r in runs])
            except Exception as e:
                self._status_failed(runs, e)
        for name, request in requests.items():
            runs = by_cluster[name]
            try:
                statuses = self.sdk.get(request)
            except Exception as e:
                self._status_failed(runs, e)
                continue
            for run in runs:
                run.unreadable_since = None
                status = _status_name(statuses.get(run.job_id))
                if status is None or status == "FAILED_DRIVER":
                    # the job vanished or its driver died: preemption shows up this way
                    if self._cluster_is_up(run.cluster) is False:
                        self._cluster_lost(run.cluster, f"job {run.job_id} status {status}")
                        continue
                    if status is None:
                        self._end(
                            run, RunExit(None, lost=True, detail=f"job {run.job_id} not found on `{name}`")
                        )
                        continue
                if status in _TERMINAL:
                    with self._lock:
                        if run.state != "running":
                            continue
                        run.state = "fetching"
                    self._thread(self._fetch, run, status)

    def _status_failed(self, runs: list[_Run], error: BaseException) -> None:
        cluster = runs[0].cluster
        if _is_gone(error) or self._cluster_is_up(cluster) is False:
            self._cluster_lost(cluster, _one_line(error))
            return
        now = time.time()
        for run in runs:  # the API server hiccuped: the job goes on, ask again next turn
            run.unreadable_since = run.unreadable_since or now
            if now - run.unreadable_since > STATUS_PATIENCE:
                detail = f"job status unreadable for {STATUS_PATIENCE:.0f} s: {_one_line(error)}"
                self._end(run, RunExit(None, lost=True, detail=detail))

    def _wait_job(self, cluster: str, job_id: int) -> str | None:
        while not self._stop.is_set():
            status = _status_name(self.sdk.get(self.sdk.job_status(cluster, [job_id])).get(job_id))
            if status is None or status in _TERMINAL:
                return status
            self._stop.wait(self.status_interval)
        return None

    def _tail(self, cluster: str, job_id: int, make_out: Any) -> Any:
        """A finished job's whole log into a fresh `make_out()` per try, retried with backoff.

        Returns:
            The output object that received the log; the last error is raised.
        """
        for i in range(self.log_retries):
            out = make_out()
            try:
                self.sdk.tail_logs(cluster, job_id, follow=False, output_stream=out)
                return out
            except Exception as e:
                if _is_gone(e) or i == self.log_retries - 1:
                    raise
                self._stop.wait(self.retry_delay * 2**i)
        raise AssertionError("unreachable")

    def _follow(self, run: _Run) -> None:
        """Stream the job's log into `log.txt` until the job ends, so its end is seen at once.

        Anything unclear (an error, a failure without the run script's exit line, which is how
        a preemption looks) is left to the monitor, which polls the job's status and reads the
        log again with retries.
        """
        # once the monitor has taken the run over, it rewrites the log: this stream stops writing
        sink = JobLogSink(run.spec.log_path, active=lambda: run.state == "running")
        try:
            code = self.sdk.tail_logs(run.cluster.name, run.job_id, follow=True, output_stream=sink)
        except Exception as e:
            log.info("log stream of job %s on %s broke: %s", run.job_id, run.cluster.name, e)
            return
        sink.finish()
        status = _EXIT_STATUS.get(code)
        if status is None or (status == "FAILED" and "exit" not in sink.tags):
            return
        with self._lock:
            if run.state != "running":
                return
            run.state = "fetching"
        self._finish(run, status, sink.tags)

    def _fetch(self, run: _Run, status: str) -> None:
        try:
            sink = self._tail(run.cluster.name, run.job_id, lambda: JobLogSink(run.spec.log_path))
        except Exception as e:
            self._end(
                run,
                RunExit(
                    None,
                    lost=True,
                    detail=f"the log of job {run.job_id} on `{run.cluster.name}` could not be read "
                    f"after {self.log_retries} tries: {_one_line(e)}",
                ),
            )
            return
        sink.finish()
        self._finish(run, status, sink.tags)

    def _finish(self, run: _Run, status: str, tags: dict[str, str]) -> None:
        """Complete the log where the controller reads it, then report the end."""
        if self._stop.is_set():
            return  # this backend was closed: a newer controller owns the run now
        code = tags.get("code") if tags.get("code") not in (None, "", "none") else None
        extra = run_keys(
            read_tail(run.spec.log_path),
            tier=run.spec.env.get("NIGHTLAB_TIER", ""),
            gpu=tags.get("gpu"),
            code=code,
        )
        if extra:
            with open(run.spec.log_path, "a") as f:
                f.write(extra)
        exit_tag = tags.get("exit")
        if exit_tag is not None and re.fullmatch(r"-?\d+", exit_tag):
            ended = RunExit(int(exit_tag), code=code)
        elif status == "SUCCEEDED":
            ended = RunExit(0, code=code)
        elif status == "CANCELLED":
            ended = RunExit(None, detail="job cancelled", code=code)
        else:  # the run script itself died (driver failure, OOM kill of the node)
            ended = RunExit(None, lost=True, detail=f"job {run.job_id} ended {status} without an exit status")
        self._end(run, ended)

    # ------------------------------------------------------------------ ledger events

    def _event(self, kind: str, worker: str, data: dict[str, Any]) -> None:
        with self._lock:
            self._pending_events.append((kind, worker, data))
        self._flush_events()

    def _last_cluster_events(self) -> dict[str, str]:
        """The kind of the latest cluster event of each worker, from the ledger."""
        from nightlab.fleet.costs import CLUSTER_EVENTS
        from nightlab.ledger import open_ledger

        self._flush_events()
        try:
            with open_ledger(self.lab_dir) as ledger:
                events = ledger.events(limit=1_000_000, kinds=CLUSTER_EVENTS)
        except NightlabError:
            return {}
        return {e.worker: e.kind for e in events if e.worker}

    def _flush_events(self) -> None:
        with self._lock:
            if self.lab_dir is None or not self._pending_events:
                return
            pending, self._pending_events = self._pending_events, []
        from nightlab.ledger import open_ledger

        try:
            with open_ledger(self.lab_dir) as ledger:
                for kind, worker, data in pending:
                    ledger.log_event(kind, None, worker=worker, **data)
        except NightlabError as e:
            log.warning("could not record cluster events: %s", e)


def _key(spec: RunSpec) -> str:
    return f"{spec.experiment_id}/{spec.attempt}"


def _field(record: Any, name: str) -> Any:
    """A field of an SDK response, which is a pydantic model or (older servers) a dict."""
    if isinstance(record, dict):
        return record.get(name)
    return getattr(record, name, None)


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


# ---------------------------------------------------------------------------- CLI entry points


def _lab_backend(lab_dir: Path, sdk: Any) -> SkyPilotBackend:
    from nightlab.config import load_lab_config

    config = load_lab_config(lab_dir).config
    if not any(p.backend == "skypilot" for p in config.fleet.pools):
        raise UsageError(
            'nightlab.toml has no [[fleet.pool]] with `backend = "skypilot"`; add one (see docs/skypilot.md)'
        )
    return SkyPilotBackend(config, lab_dir=lab_dir, sdk=sdk)


def fleet_up(
    lab_dir: Path, *, relaunch: bool = False, sdk: Any = None, on_change: Any = None
) -> list[dict[str, Any]]:
    """Launch and set up one cluster per skypilot worker of the lab; waits for all of them.

    Args:
        relaunch: launch clusters that are already up again (reruns their set-up).
        sdk: the SDK to call (the `sky` module by default).
        on_change: called with (worker, state, detail) as clusters change.

    Returns:
        One dict per worker (worker, cluster, state, detail, gpu_name, hourly_price).

    Raises:
        UsageError: the lab has no skypilot pool, or SkyPilot is not installed.
    """
    backend = _lab_backend(lab_dir, sdk)
    try:
        return backend.up(relaunch=relaunch, on_change=on_change)
    finally:
        backend.close()


def fleet_down(lab_dir: Path, *, sdk: Any = None) -> list[str]:
    """Tear down every SkyPilot cluster of the lab; returns the names torn down.

    Raises:
        NightlabError: some clusters could not be torn down (named, with the fix).
    """
    backend = _lab_backend(lab_dir, sdk)
    try:
        return backend.down()
    finally:
        backend.close()
