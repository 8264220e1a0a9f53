"""The cluster half of the SkyPilot backend: one state machine per worker cluster.

States: `unknown` (not asked yet) -> `checking` (one `sky.status` for all) -> `up` or
`down`; `down` or `failed` (after its backoff) -> `launching` (`sky.launch` with the lab's
`fleet/skypilot.yaml`, which runs set-up and a probe) -> `up` or `failed`. A cluster that
was up and is found gone (preempted, stopped by autostop) goes back to `down` and is
launched again when work needs it. Set-up failures (and a broken worker YAML) are never
retried before `nightlab fleet up` or the next controller: they would fail the same way.
Every change is a ledger event (`cluster-launch`, `cluster-up`, `cluster-failed`,
`cluster-lost`, `cluster-down`) that `fleet status` and `fleet/costs.py` read.
"""

from __future__ import annotations

import contextlib
import io
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from nightlab.config import LabConfig, PoolConfig, slots_per_cluster
from nightlab.errors import NightlabError, UsageError
from nightlab.fleet.build import Wheel, build_wheel
from nightlab.fleet.cluster_states import ClusterEvent, ClusterState
from nightlab.fleet.costs import hourly_price
from nightlab.fleet.job_log import clean_job_log
from nightlab.fleet.sky_task import (
    WHEEL_DIR,
    _sky,
    cluster_task,
    load_worker_config,
    pip_override,
)
from nightlab.fleet.skypilot import core
from nightlab.fleet.skypilot.core import (
    Shared,
    SkyClusterStatus,
    SkyJobStatus,
    autostop_minutes,
    cluster_name,
    field_of,
    log,
    one_line,
    status_name,
)

_STDOUT_LOCK = threading.Lock()


@dataclass
class Cluster:
    """One worker's cluster as this backend last saw it."""

    worker: str
    name: str
    pool: PoolConfig
    state: ClusterState = ClusterState.UNKNOWN
    detail: str | None = None
    retry_at: float = 0.0
    gpu_name: str | None = None
    software: dict[str, str | None] = field(default_factory=dict)  # nightlab version + code, torch, sandbox
    hourly_price: float | None = None
    cpus: str | None = None  # the launched cluster's CPUs (SkyPilot's `launched_resources.cpus`)
    changed: threading.Condition = field(default_factory=threading.Condition)

    @property
    def hopeless(self) -> bool:
        """Failed in a way that is not retried before `fleet up` (set-up, bad YAML)."""
        return self.state == ClusterState.FAILED and self.retry_at == float("inf")

    def view(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "cluster": self.name,
            "state": self.state,
            "detail": self.detail,
            "gpu_name": self.gpu_name,
            "hourly_price": self.hourly_price,
            "slots": slots_per_cluster(self.pool),
        }


class Clusters:
    """The clusters of one backend: checking, launching and losing them (module docstring)."""

    def __init__(
        self, shared: Shared, config: LabConfig, pools: dict[str, PoolConfig], *, relaunch_backoff: float
    ) -> None:
        self.shared = shared
        self.config = config
        self.pools = pools
        self.relaunch_backoff = relaunch_backoff
        self.on_change: Any = None  # called with (worker, state, detail) on every change
        self.before_launch: Any = None  # called with the cluster before each `sky.launch`
        self._clusters: dict[str, Cluster] = {}
        self._wheel: Wheel | None = None

    def get(self, worker: str) -> Cluster:
        """The worker's cluster (created `unknown` on first use)."""
        with self.shared.lock:
            cluster = self._clusters.get(worker)
            if cluster is None:
                pool = self.pools.get(worker)
                if pool is None:
                    raise NightlabError(
                        f"worker `{worker}` is in no skypilot pool of nightlab.toml; restore its [[fleet.pool]]"
                    )
                cluster = Cluster(worker, cluster_name(self.shared.lab_dir, worker), pool)
                self._clusters[worker] = cluster
            return cluster

    def all(self) -> list[Cluster]:
        with self.shared.lock:
            return list(self._clusters.values())

    def wake_all(self) -> None:
        """Wake everything waiting on a cluster (the backend is closing)."""
        for cluster in self.all():
            with cluster.changed:
                cluster.changed.notify_all()

    def ensure(self, cluster: Cluster) -> None:
        """Start whatever brings the cluster closer to up: a status check or a launch."""
        with self.shared.lock:
            now = time.time()
            if cluster.state == ClusterState.UNKNOWN:
                cluster.state = ClusterState.CHECKING
                action = self._check_one
            elif cluster.state in (ClusterState.DOWN, ClusterState.FAILED) and now >= cluster.retry_at:
                cluster.state = ClusterState.LAUNCHING
                action = self.launch
            else:
                return
        self.notify(cluster)
        self.shared.thread(action, cluster)

    def _check_one(self, cluster: Cluster) -> None:
        self.check([cluster])

    def check(self, clusters: list[Cluster]) -> None:
        """Ask SkyPilot which of the clusters are up (one request for all)."""
        sdk = self.shared.sdk
        try:
            refresh = _sky().StatusRefreshMode.AUTO  # refreshes clusters with autostop or spot
            records = sdk.get(sdk.status(cluster_names=[c.name for c in clusters], refresh=refresh))
        except Exception as e:
            # no answer is not "down": relaunching a live cluster would queue its set-up behind the
            # jobs (and the resident runner) that run there; the next `ensure` asks again
            log.warning("sky status failed: %s", e)
            self.shared.stop.wait(core.STATUS_RETRY)
            with self.shared.lock:
                for c in clusters:
                    if c.state == ClusterState.CHECKING:
                        c.state = ClusterState.UNKNOWN
            for c in clusters:
                self.notify(c)
            return
        by_name = {field_of(r, "name"): r for r in records}
        with self.shared.lock:
            last = dict(self.shared.last_cluster_event)
        for c in clusters:
            record = by_name.get(c.name)
            # an UP cluster whose set-up failed or never finished (a launch interrupted by a
            # dying process) is not ready: it is launched again, which reruns set-up
            ready = last.get(c.worker) in (None, ClusterEvent.UP)
            up = (
                record is not None
                and status_name(field_of(record, "status")) == SkyClusterStatus.UP
                and ready
            )
            with self.shared.lock:
                if c.state not in (ClusterState.UNKNOWN, ClusterState.CHECKING):
                    continue
                c.state = ClusterState.UP if up else ClusterState.DOWN
                if up and c.hourly_price is None:
                    c.hourly_price = hourly_price(
                        field_of(record, "handle"), c.pool.options.get("hourly_price")
                    )
                if up:
                    c.cpus = launched_cpus(field_of(record, "handle"))
            self.notify(c)

    def is_up(self, cluster: Cluster) -> bool | None:
        """Whether SkyPilot, asking the cloud, says the cluster is UP (None: cannot tell)."""
        sdk = self.shared.sdk
        try:
            refresh = _sky().StatusRefreshMode.FORCE  # ask the cloud: is it really gone?
            records = sdk.get(sdk.status(cluster_names=[cluster.name], refresh=refresh))
        except Exception:
            return None
        return any(
            field_of(r, "name") == cluster.name and status_name(field_of(r, "status")) == SkyClusterStatus.UP
            for r in records
        )

    # ------------------------------------------------------------------ launching

    def _build(self) -> Wheel | None:
        """The controller's own nightlab as a wheel, built once (None when the YAML overrides it)."""
        lab_dir = self.shared.lab_dir
        with self.shared.lock:
            if self._wheel is None and pip_override(load_worker_config(lab_dir)) is None:
                self._wheel = build_wheel(lab_dir / WHEEL_DIR)
            return self._wheel

    def launch(self, cluster: Cluster) -> None:
        """`sky.launch` the cluster, wait for set-up and the probe, and record the outcome."""
        shared, sdk, pool = self.shared, self.shared.sdk, cluster.pool
        start = time.time()
        log_dir = shared.lab_dir / ".nightlab" / "fleet" / cluster.name
        log_dir.mkdir(parents=True, exist_ok=True)
        launch_log = log_dir / "launch.log"
        shared.event(ClusterEvent.LAUNCH, cluster.worker, {"cluster": cluster.name})
        try:
            if self.before_launch is not None:
                self.before_launch(cluster)
            task = cluster_task(
                shared.lab_dir,
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
                request = sdk.launch(
                    task,
                    cluster_name=cluster.name,
                    idle_minutes_to_autostop=autostop,
                    down=autodown and autostop is not None,
                )
            with open(launch_log, "w") as out:
                job_id, handle = sdk.stream_and_get(request, output_stream=out)
            status = shared.wait_job(cluster.name, job_id)
            setup = shared.tail(cluster.name, job_id, io.StringIO)  # raw: SkyPilot's lines help here
        except Exception as e:
            reason = "no capacity" if type(e).__name__ == "ResourcesUnavailableError" else "launch failed"
            # a broken fleet/skypilot.yaml fails the same way every time: only `fleet up` retries it
            retry = not isinstance(e, UsageError)
            self.failed(cluster, f"{reason}: {one_line(e)}", retry=retry, log_path=launch_log)
            return
        with open(launch_log, "a") as out:
            out.write(setup.getvalue())
        if status != SkyJobStatus.SUCCEEDED:
            # the cluster is up (and billing) until autostop ends it; costs.py counts that
            self.failed(
                cluster,
                f"set-up failed (job status {status})",
                retry=False,
                log_path=launch_log,
                provisioned=True,
            )
            return
        _, tags = clean_job_log(setup.getvalue())
        with shared.lock:
            cluster.state, cluster.detail = ClusterState.UP, None
            cluster.gpu_name = tags.get("gpu") or None
            cluster.software = {k: tags.get(k) for k in ("version", "code", "torch", "sandbox")}
            cluster.hourly_price = hourly_price(handle, pool.options.get("hourly_price"))
            cluster.cpus = launched_cpus(handle)
        shared.event(
            ClusterEvent.UP,
            cluster.worker,
            {
                "cluster": cluster.name,
                "setup_seconds": time.time() - start,
                "hourly_price": cluster.hourly_price,
                "gpu_name": cluster.gpu_name,
                "nightlab_version": cluster.software.get("version"),
                "nightlab_code": cluster.software.get("code"),
                "torch_version": cluster.software.get("torch"),
                "sandbox": cluster.software.get("sandbox"),
                "autostop_minutes": autostop_minutes(pool),
                "accelerators": pool.options.get("accelerators"),
                "infra": pool.options.get("infra"),
                "slots": slots_per_cluster(pool),  # experiments at once; costs.py divides the price by it
            },
        )
        self.notify(cluster)

    def failed(
        self, cluster: Cluster, detail: str, *, retry: bool, log_path: Any, provisioned: bool = False
    ) -> None:
        with self.shared.lock:
            cluster.state, cluster.detail = ClusterState.FAILED, detail
            cluster.retry_at = time.time() + self.relaunch_backoff if retry else float("inf")
        data = {"cluster": cluster.name, "detail": detail, "log": str(log_path), "provisioned": provisioned}
        self.shared.event(ClusterEvent.FAILED, cluster.worker, data)
        log.warning("cluster %s: %s (log: %s)", cluster.name, detail, log_path)
        self.notify(cluster)

    def down(self, cluster: Cluster, detail: str) -> None:
        """Record that a cluster we thought up is not (preempted, stopped by autostop, deleted)."""
        with self.shared.lock:
            was_up = cluster.state == ClusterState.UP
            if was_up:
                # SkyPilot's Slurm clean-up of the lost allocation deletes the cluster's home, the
                # same path a relaunch sets up again: relaunching at once raced it (broken venv)
                cluster.state, cluster.retry_at = ClusterState.DOWN, time.time() + core.LOST_RELAUNCH_DELAY
        if was_up:
            self.shared.event(ClusterEvent.LOST, cluster.worker, {"cluster": cluster.name, "detail": detail})
        self.notify(cluster)

    def notify(self, cluster: Cluster) -> None:
        with cluster.changed:
            cluster.changed.notify_all()
        if self.on_change is not None:
            self.on_change(cluster.worker, cluster.state, cluster.detail)


def launched_cpus(handle: Any) -> str | None:
    """A launched cluster's CPUs as SkyPilot's handle has them (None when it does not say)."""
    cpus = getattr(getattr(handle, "launched_resources", None), "cpus", None)
    return None if cpus is None else str(cpus)
