"""A fake of SkyPilot's SDK network calls, for tests and the fleet benchmark.

It replaces only the calls that would reach an API server or a cloud (`launch`, `exec`,
`get`, `stream_and_get`, `job_status`, `tail_logs`, `cancel`, `down`, `stop`, `status`,
`queue`, `autostop`) and takes the real `sky.Task` / `sky.Resources` objects the backend
builds. Requests run on threads, as on the API server, after latencies multiplied by
`scale` (a 3-minute cluster launch is 0.18 s at `scale=0.001`).

This module is the API server's side: requests, their answers and SkyPilot's rules for each
call. What the calls act on, the clusters (a directory each) and the jobs they run for real
under bash, is `fake_cloud.FakeCloud` (`self.cloud`; `clusters` is its dict). As on a Slurm
cluster, `sky exec` answers with the job id while the job is still INIT, and a cancel of an
INIT job does nothing, as SkyPilot's does ("No jobs cancelled").

Faults: `fail_setup(cluster)`, `no_capacity(cluster)`, `preempt(cluster)`,
`preempt_job(name_part, after)`, `fail_logs(times)`, `fail_status(times)`. Autostop: a cluster
with no running job for its `idle_minutes_to_autostop` (scaled) stops itself (or goes away
with `down`).

Usage::

    fake = FakeSky(root=tmp_path / "clusters", scale=0.001)
    fake.install(monkeypatch)          # sky.launch etc. now reach the fake
    backend = SkyPilotBackend(config, lab_dir=lab, sdk=fake)   # or inject it directly

`nightlab.testing.skypilot_conformance` checks the two modules together against the real SDK.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import sky
from sky import exceptions

from nightlab.testing.fake_cloud import FakeCloud, FakeCluster, kill

# what SkyPilot's cancel acts on (job_lib.cancel_jobs): not INIT, not a terminal status
CANCELLABLE = (sky.JobStatus.PENDING, sky.JobStatus.SETTING_UP, sky.JobStatus.RUNNING)
SDK_CALLS = (
    "launch",
    "exec",
    "get",
    "stream_and_get",
    "job_status",
    "tail_logs",
    "cancel",
    "down",
    "stop",
    "status",
    "queue",
    "autostop",
)


def _refuse_network(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("the fake SkyPilot SDK refuses a call that would reach an API server")


class FakeSky:
    """Simulated clusters, job queues, logs, preemptions and slow set-ups (module docstring).

    Args:
        root: directory under which each fake cluster gets its home.
        scale: multiplies every latency below (seconds of the real thing).
        launch_seconds: provisioning time of a cluster.
        setup_seconds: the set-up script's time.
        exec_seconds: from `sky.exec` to its answer (the job id; the job is INIT).
        queue_seconds: from that answer to the job being queued (PENDING) on the cluster.
        request_seconds: the API server's answer time for the small calls.
        prepare_data: run set-up's data step for real (`fake_cloud` module docstring).
    """

    # a fake cluster is a directory on this machine: the resident runner's helper runs here
    # (`channel.local_argv`), where the real path goes over ssh and srun into the allocation
    local_channels = True

    def __init__(
        self,
        root: Path,
        *,
        scale: float = 1.0,
        launch_seconds: float = 180.0,
        setup_seconds: float = 120.0,
        exec_seconds: float = 5.0,
        queue_seconds: float = 1.0,
        request_seconds: float = 0.5,
        prepare_data: bool = False,
    ) -> None:
        self.root = Path(root)
        self.scale = scale
        self.launch_seconds = launch_seconds
        self.exec_seconds = exec_seconds
        self.request_seconds = request_seconds
        self._lock = threading.RLock()
        self.cloud = FakeCloud(
            self.root,
            self._lock,
            scale=scale,
            setup_seconds=setup_seconds,
            queue_seconds=queue_seconds,
            prepare_data=prepare_data,
        )
        self.calls: list[tuple[str, tuple, dict]] = []
        self.tasks: list[tuple[str, str, Any]] = []  # (call, cluster, sky.Task) for inspection
        self._requests: dict[str, dict[str, Any]] = {}
        self._ids = itertools.count(1)
        self._capacity_failures: dict[str, int] = {}
        self._log_failures = 0
        self._status_failures = 0

    @property
    def clusters(self) -> dict[str, FakeCluster]:
        """The fake clusters by name (`FakeCloud.clusters`)."""
        return self.cloud.clusters

    def stop_jobs(self) -> None:
        """Kill every job process still running, by PID (a test's teardown, also after a failure)."""
        self.cloud.stop_jobs()

    # ------------------------------------------------------------------ wiring

    def install(self, monkeypatch: Any) -> FakeSky:
        """Replace the SDK's network calls on the `sky` module with this fake's.

        Anything that still reaches the real SDK's HTTP layer (or would start a local API
        server) raises instead, so a test can never talk to a cloud by accident.
        """
        for name in SDK_CALLS:
            monkeypatch.setattr(sky, name, getattr(self, name))
        monkeypatch.setattr(sky, "local_channels", True, raising=False)  # a backend built on `sky` itself
        from sky.server import common

        # Set for the rest of the process, not through monkeypatch: a backend thread that outlives
        # its test would otherwise reach the restored SDK and start a real local API server.
        for name in ("check_server_healthy_or_start_fn", "make_authenticated_request"):
            setattr(common, name, _refuse_network)
        return self

    def _record(self, name: str, *args: Any, **kwargs: Any) -> None:
        with self._lock:
            self.calls.append((name, args, kwargs))

    def count(self, name: str) -> int:
        return sum(1 for c in self.calls if c[0] == name)

    # ------------------------------------------------------------------ faults

    def fail_setup(self, cluster: str) -> None:
        """The next launch of `cluster` ends with its set-up failing (job FAILED_SETUP)."""
        self.cloud.fail_setup(cluster)

    def no_capacity(self, cluster: str, times: int = 1) -> None:
        """The next `times` launches of `cluster` raise ResourcesUnavailableError."""
        self._capacity_failures[cluster] = times

    def fail_status(self, times: int) -> None:
        """The next `times` `job_status` requests fail as if the API server were unreachable."""
        with self._lock:
            self._status_failures = times

    def fail_logs(self, times: int) -> None:
        """The next `times` `tail_logs` calls fail as if the API server were unreachable."""
        with self._lock:
            self._log_failures = times

    def preempt_job(self, name_part: str, after: float = 0.0) -> None:
        """Preempt the cluster of the first job whose name contains `name_part`, `after` s into it."""
        self.cloud.preempt_job(name_part, after)

    def preempt(self, cluster: str) -> None:
        """The cloud takes the cluster back: its jobs die and it is no longer up."""
        self.cloud.preempt(cluster)

    # ------------------------------------------------------------------ requests

    def _submit(self, delay: float, work: Any) -> str:
        rid = f"fake-request-{next(self._ids)}"
        done = threading.Event()
        entry: dict[str, Any] = {"done": done, "log": []}
        with self._lock:
            self._requests[rid] = entry

        def run() -> None:
            time.sleep(delay * self.scale)
            try:
                entry["result"] = work(entry["log"])
            except BaseException as e:
                entry["error"] = e
            done.set()

        threading.Thread(target=run, daemon=True).start()
        return rid

    def get(self, request_id: str) -> Any:
        self._record("get", request_id)
        entry = self._requests[request_id]
        entry["done"].wait()
        if "error" in entry:
            raise entry["error"]
        return entry.get("result")

    def stream_and_get(
        self,
        request_id: str | None = None,
        log_path: str | None = None,
        tail: int | None = None,
        follow: bool = True,
        output_stream: Any = None,
        relay_rich_status: bool = False,
    ) -> Any:
        self._record("stream_and_get", request_id)
        entry = self._requests[request_id]
        entry["done"].wait()
        if output_stream is not None:
            output_stream.write("".join(line + "\n" for line in entry["log"]))
        if "error" in entry:
            raise entry["error"]
        return entry.get("result")

    # ------------------------------------------------------------------ SDK calls

    def launch(
        self,
        task: Any,
        cluster_name: str | None = None,
        retry_until_up: bool = False,
        idle_minutes_to_autostop: int | None = None,
        down: bool = False,
        **kwargs: Any,
    ) -> str:
        if not isinstance(task, sky.Task):
            raise TypeError(f"sky.launch takes a sky.Task, got {type(task).__name__}")
        self._record("launch", cluster_name, idle_minutes_to_autostop=idle_minutes_to_autostop, down=down)
        self.tasks.append(("launch", cluster_name, task))
        print(f"Running on cluster: {cluster_name}")  # the real client prints this to stdout too

        def work(log: list[str]) -> Any:
            log.append(f"Launching cluster {cluster_name}...")
            if self._capacity_failures.get(cluster_name, 0) > 0:
                self._capacity_failures[cluster_name] -= 1
                raise exceptions.ResourcesUnavailableError(f"no capacity for {cluster_name}")
            c = self.cloud.provision(cluster_name, task, autostop=idle_minutes_to_autostop, down=down)
            log.append(f"Cluster {cluster_name} is up.")
            job = self.cloud.add_job(c, task, setup=True)
            return job.id, c.handle

        return self._submit(self.launch_seconds, work)

    def exec(self, task: Any, cluster_name: str | None = None, **kwargs: Any) -> str:
        if not isinstance(task, sky.Task):
            raise TypeError(f"sky.exec takes a sky.Task, got {type(task).__name__}")
        self._record("exec", cluster_name, job=task.name)
        self.tasks.append(("exec", cluster_name, task))

        def work(log: list[str]) -> Any:
            c = self.cloud.up(cluster_name)
            job = self.cloud.add_job(c, task, setup=False)
            return job.id, c.handle

        return self._submit(self.exec_seconds, work)

    def job_status(self, cluster_name: str, job_ids: list[int] | None = None) -> str:
        self._record("job_status", cluster_name, job_ids)

        def work(log: list[str]) -> Any:
            with self._lock:
                if self._status_failures > 0:
                    self._status_failures -= 1
                    raise exceptions.ApiServerConnectionError("http://127.0.0.1:46580")
            c = self.cloud.up(cluster_name)
            ids = job_ids if job_ids is not None else [max(c.jobs)] if c.jobs else []
            return {i: (c.jobs[i].status if i in c.jobs else None) for i in ids}

        return self._submit(self.request_seconds, work)

    def tail_logs(
        self,
        cluster_name: str,
        job_id: int | None,
        follow: bool,
        tail: int = 0,
        output_stream: Any = None,
        *,
        preload_content: bool = True,
    ) -> int:
        self._record("tail_logs", cluster_name, job_id)
        time.sleep(self.request_seconds * self.scale)
        with self._lock:
            if self._log_failures > 0:
                self._log_failures -= 1
                raise exceptions.ApiServerConnectionError("http://127.0.0.1:46580")
        c = self.cloud.up(cluster_name)
        job = c.jobs.get(job_id if job_id is not None else max(c.jobs))
        if job is None:
            return 102  # JobExitCode.NOT_FOUND
        out = output_stream or sys.stdout
        out.write(
            "├── Waiting for task resources on 1 node.\n"
            "└── Job started. Streaming logs... (Ctrl-C to exit log streaming; job will not be killed)\n"
        )
        sent = 0
        while True:  # with `follow`, stream lines as the job prints them until it ends
            done = not follow or job.status.is_terminal()
            lines = list(job.lines)
            out.write("".join(line + "\n" for line in lines[sent:]))
            sent = len(lines)
            if done:
                break
            time.sleep(0.005)
        if job.status.is_terminal():
            out.write(f"✓ Job finished (status: {job.status.value}).\n")
        return {sky.JobStatus.SUCCEEDED: 0, sky.JobStatus.CANCELLED: 103}.get(job.status, 100)

    def cancel(
        self,
        cluster_name: str,
        all: bool = False,
        all_users: bool = False,
        job_ids: list[int] | None = None,
        **kwargs: Any,
    ) -> str:  # noqa: A002 - SDK's name
        self._record("cancel", cluster_name, job_ids)

        def work(log: list[str]) -> None:
            c = self.cloud.up(cluster_name)
            with self._lock:  # one step against the job's own start (`FakeCloud._run_job_holding_gpu`)
                for i in job_ids or []:
                    job = c.jobs.get(i)
                    if job is not None and job.status in CANCELLABLE:
                        kill(job)
                        job.status = sky.JobStatus.CANCELLED

        return self._submit(self.request_seconds, work)

    def down(self, cluster_name: str, purge: bool = False, **kwargs: Any) -> str:
        self._record("down", cluster_name)

        def work(log: list[str]) -> None:
            self.cloud.remove(cluster_name)

        return self._submit(self.request_seconds, work)

    def stop(self, cluster_name: str, purge: bool = False, **kwargs: Any) -> str:
        self._record("stop", cluster_name)

        def work(log: list[str]) -> None:
            c = self.cloud.up(cluster_name)
            for job in c.jobs.values():
                kill(job)
            c.status = sky.ClusterStatus.STOPPED

        return self._submit(self.request_seconds, work)

    def autostop(self, cluster_name: str, idle_minutes: int, down: bool = False, **kwargs: Any) -> str:
        self._record("autostop", cluster_name, idle_minutes, down=down)

        def work(log: list[str]) -> None:
            c = self.cloud.up(cluster_name)
            c.autostop, c.autodown = idle_minutes, down

        return self._submit(self.request_seconds, work)

    def status(
        self,
        cluster_names: list[str] | None = None,
        refresh: Any = None,
        all_users: bool = False,
        **kwargs: Any,
    ) -> str:
        self._record("status", cluster_names)

        def work(log: list[str]) -> Any:
            self.cloud.sweep()
            with self._lock:
                found = [
                    c for c in self.clusters.values() if cluster_names is None or c.name in cluster_names
                ]
                return [
                    SimpleNamespace(
                        name=c.name,
                        status=c.status,
                        handle=c.handle,
                        autostop=c.autostop if c.autostop is not None else -1,
                        to_down=c.autodown,
                        resources_str=f"1x({c.accelerator or 'cpu'})",
                    )
                    for c in found
                ]

        return self._submit(self.request_seconds, work)

    def queue(self, cluster_name: str, skip_finished: bool = False, all_users: bool = False) -> str:
        self._record("queue", cluster_name)

        def work(log: list[str]) -> Any:
            c = self.cloud.up(cluster_name)
            return [
                SimpleNamespace(job_id=j.id, job_name=j.name, status=j.status, submitted_at=j.submitted_at)
                for j in c.jobs.values()
                if not (skip_finished and j.status.is_terminal())
            ]

        return self._submit(self.request_seconds, work)
