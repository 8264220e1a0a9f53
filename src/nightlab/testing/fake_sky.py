"""A fake of SkyPilot's SDK network calls, for tests and the fleet benchmark.

It replaces only the calls that would reach an API server or a cloud (`launch`, `exec`,
`get`, `stream_and_get`, `job_status`, `tail_logs`, `cancel`, `down`, `stop`, `status`,
`queue`, `autostop`) and takes the real `sky.Task` / `sky.Resources` objects the backend
builds. Requests run on threads, as on the API server, after latencies multiplied by
`scale` (a 3-minute cluster launch is 0.18 s at `scale=0.001`).

A fake cluster is a directory standing in for its home: the task's `workdir` (the lab) is
copied to `sky_workdir` at launch, its git-tracked files only (SkyPilot honours .gitignore),
`nightlab-venv` links to this
Python's environment (what set-up would have installed) and `bin/nvidia-smi` prints the
GPU name of the cluster's accelerator. Jobs run for real: the task's `run` script under
bash with the task's envs and HOME set to the cluster's directory, and every output line
goes to the job log with SkyPilot's `(name, pid=N) ` prefix. So the backend's payload,
run script, timeout, summary and exit status are all exercised end to end. Jobs on one
cluster share its GPUs as SkyPilot's scheduler does: a job asking for `H100:1` on an `H100:4`
cluster runs beside three others (a fraction, `H100:0.5`, beside another on the same
unit), a job asking for none or all of them runs alone, and a job that does not fit waits
PENDING, as in SkyPilot's job queue. Like Ray, the fake sets no device: which GPU a job uses
is the run script's pin (`NIGHTLAB_GPU`). As on a Slurm cluster, `sky exec` answers with the job id while the
job is still INIT (its submission goes on in the background for `queue_seconds`), and a cancel
of an INIT job does nothing, as SkyPilot's does ("No jobs cancelled"). Set-up is simulated (a
delay), not run; the task's `file_mounts` are copied into the cluster's home at every launch, and
with `prepare_data=True` set-up's data step runs for real (`python -m nightlab.fleet.sky_task
prepare` in `sky_workdir`, for a built-in target), into the cluster's own data root.

Faults: `fail_setup(cluster)`, `no_capacity(cluster)`, `preempt(cluster)`,
`preempt_job(name_part, after)`, `fail_logs(times)`, `fail_status(times)`. Autostop: a cluster with no running
job for its `idle_minutes_to_autostop` (scaled) stops itself (or goes away with `down`).

Usage::

    fake = FakeSky(root=tmp_path / "clusters", scale=0.001)
    fake.install(monkeypatch)          # sky.launch etc. now reach the fake
    backend = SkyPilotBackend(config, lab_dir=lab, sdk=fake)   # or inject it directly

Why one module of ~570 lines: it is one fake of one SDK. Every SDK call and the simulated
clusters, job queues and faults it acts on share one lock and one set of dicts; split
apart, the simulation would need an interface of its own that nothing else uses, and
`nightlab.testing.skypilot_conformance` checks this file against the real SDK as a whole.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import sky
from sky import exceptions

GPU_NAMES = {"H100": "NVIDIA H100 80GB HBM3", "H200": "NVIDIA H200", "A100": "NVIDIA A100-SXM4-80GB"}
# Illustrative on-demand prices ($/h for one GPU); a real handle prices from SkyPilot's catalog.
PRICES = {"H100": 2.99, "H200": 3.79, "A100": 1.79}
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


@dataclass
class _PricedResources:
    """What a launched handle's `launched_resources` offers the cost code."""

    accelerators: dict[str, int] | None
    price: float

    def get_cost(self, seconds: float) -> float:
        return self.price * seconds / 3600


@dataclass
class FakeJob:
    id: int
    name: str
    task: Any
    status: Any = sky.JobStatus.PENDING
    lines: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    submitted_at: float = field(default_factory=time.time)
    started_at: float | None = None
    ended_at: float | None = None


@dataclass
class FakeCluster:
    name: str
    home: Path
    task: Any
    accelerator: str | None
    status: Any = sky.ClusterStatus.INIT
    jobs: dict[int, FakeJob] = field(default_factory=dict)
    autostop: int | None = None
    autodown: bool = False
    idle_since: float = field(default_factory=time.time)
    handle: Any = None
    gpus: int = 1  # the launch's accelerator count (a cluster without one is one unit)
    gpus_free: float = 1.0  # what running jobs have not taken (`_take_gpus`)


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
        prepare_data: run set-up's data step for real (module docstring).
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
        self.setup_seconds = setup_seconds
        self.exec_seconds = exec_seconds
        self.queue_seconds = queue_seconds
        self.request_seconds = request_seconds
        self.prepare_data = prepare_data
        self.clusters: dict[str, FakeCluster] = {}
        self.calls: list[tuple[str, tuple, dict]] = []
        self.tasks: list[tuple[str, str, Any]] = []  # (call, cluster, sky.Task) for inspection
        self._lock = threading.RLock()
        self._requests: dict[str, dict[str, Any]] = {}
        self._ids = itertools.count(1)
        self._setup_failures: set[str] = set()
        self._capacity_failures: dict[str, int] = {}
        self._log_failures = 0
        self._status_failures = 0
        self._preempt_jobs: list[tuple[str, float]] = []

    def stop_jobs(self) -> None:
        """Kill every job process still running, by PID (a test's teardown, also after a failure)."""
        with self._lock:
            jobs = [job for c in self.clusters.values() for job in c.jobs.values()]
        for job in jobs:
            self._kill(job)

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
        self._setup_failures.add(cluster)

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
        self._preempt_jobs.append((name_part, after))

    def preempt(self, cluster: str) -> None:
        """The cloud takes the cluster back: its jobs die and it is no longer up."""
        with self._lock:
            c = self.clusters.pop(cluster, None)
        if c is None:
            return
        for job in c.jobs.values():
            self._kill(job)
            if not job.status.is_terminal():
                job.status = sky.JobStatus.FAILED_DRIVER

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
            with self._lock:
                c = self.clusters.get(cluster_name)
                if c is None:
                    c = self._new_cluster(cluster_name, task)
                c.status = sky.ClusterStatus.UP
                c.autostop, c.autodown, c.idle_since = idle_minutes_to_autostop, down, time.time()
                _copy_file_mounts(task.file_mounts, c.home)
            log.append(f"Cluster {cluster_name} is up.")
            job = self._add_job(c, task, setup=True)
            return job.id, c.handle

        return self._submit(self.launch_seconds, work)

    def exec(self, task: Any, cluster_name: str | None = None, **kwargs: Any) -> str:
        if not isinstance(task, sky.Task):
            raise TypeError(f"sky.exec takes a sky.Task, got {type(task).__name__}")
        self._record("exec", cluster_name, job=task.name)
        self.tasks.append(("exec", cluster_name, task))

        def work(log: list[str]) -> Any:
            c = self._up(cluster_name)
            job = self._add_job(c, task, setup=False)
            return job.id, c.handle

        return self._submit(self.exec_seconds, work)

    def job_status(self, cluster_name: str, job_ids: list[int] | None = None) -> str:
        self._record("job_status", cluster_name, job_ids)

        def work(log: list[str]) -> Any:
            with self._lock:
                if self._status_failures > 0:
                    self._status_failures -= 1
                    raise exceptions.ApiServerConnectionError("http://127.0.0.1:46580")
            c = self._up(cluster_name)
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
        c = self._up(cluster_name)
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
            c = self._up(cluster_name)
            for i in job_ids or []:
                job = c.jobs.get(i)
                if job is not None and job.status in CANCELLABLE:
                    self._kill(job)
                    job.status = sky.JobStatus.CANCELLED

        return self._submit(self.request_seconds, work)

    def down(self, cluster_name: str, purge: bool = False, **kwargs: Any) -> str:
        self._record("down", cluster_name)

        def work(log: list[str]) -> None:
            with self._lock:
                c = self.clusters.pop(cluster_name, None)
            if c is None:
                raise exceptions.ClusterDoesNotExist(f"Cluster {cluster_name!r} does not exist.")
            for job in c.jobs.values():
                self._kill(job)
            shutil.rmtree(c.home, ignore_errors=True)

        return self._submit(self.request_seconds, work)

    def stop(self, cluster_name: str, purge: bool = False, **kwargs: Any) -> str:
        self._record("stop", cluster_name)

        def work(log: list[str]) -> None:
            c = self._up(cluster_name)
            for job in c.jobs.values():
                self._kill(job)
            c.status = sky.ClusterStatus.STOPPED

        return self._submit(self.request_seconds, work)

    def autostop(self, cluster_name: str, idle_minutes: int, down: bool = False, **kwargs: Any) -> str:
        self._record("autostop", cluster_name, idle_minutes, down=down)

        def work(log: list[str]) -> None:
            c = self._up(cluster_name)
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
            self._autostop_sweep()
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
            c = self._up(cluster_name)
            return [
                SimpleNamespace(job_id=j.id, job_name=j.name, status=j.status, submitted_at=j.submitted_at)
                for j in c.jobs.values()
                if not (skip_finished and j.status.is_terminal())
            ]

        return self._submit(self.request_seconds, work)

    # ------------------------------------------------------------------ simulation

    def _new_cluster(self, name: str, task: Any) -> FakeCluster:
        resources = next(iter(task.resources))
        accel = next(iter(resources.accelerators)) if resources.accelerators else None
        home = self.root / name
        (home / "bin").mkdir(parents=True, exist_ok=True)
        (home / "sky_workdir").mkdir(exist_ok=True)
        _sync_workdir(task.workdir, home / "sky_workdir")
        venv = home / "nightlab-venv"
        if not venv.exists():
            venv.symlink_to(sys.prefix)
        smi = home / "bin" / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\necho '{GPU_NAMES.get(accel or '', accel or 'none')}'\n")
        smi.chmod(0o755)
        handle = SimpleNamespace(
            cluster_name=name,
            launched_nodes=1,
            launched_resources=_PricedResources(resources.accelerators, PRICES.get(accel or "", 0.0)),
        )
        count = next(iter(resources.accelerators.values())) if resources.accelerators else 1
        gpus = max(1, int(count))
        c = FakeCluster(
            name=name,
            home=home,
            task=task,
            accelerator=accel,
            handle=handle,
            gpus=gpus,
            gpus_free=float(gpus),
        )
        self.clusters[name] = c
        return c

    def _up(self, name: str) -> FakeCluster:
        self._autostop_sweep()
        with self._lock:
            c = self.clusters.get(name)
        if c is None:
            raise exceptions.ClusterDoesNotExist(f"Cluster {name!r} does not exist.")
        if c.status != sky.ClusterStatus.UP:
            raise exceptions.ClusterNotUpError(f"Cluster {name!r} is not up.", cluster_status=c.status)
        return c

    def _autostop_sweep(self) -> None:
        now = time.time()
        with self._lock:
            for c in list(self.clusters.values()):
                busy = any(not j.status.is_terminal() for j in c.jobs.values())
                if busy:
                    c.idle_since = now
                    continue
                if c.autostop is None or c.autostop < 0 or c.status != sky.ClusterStatus.UP:
                    continue
                if now - c.idle_since >= c.autostop * 60 * self.scale:
                    if c.autodown:
                        del self.clusters[c.name]
                    else:
                        c.status = sky.ClusterStatus.STOPPED

    def _add_job(self, c: FakeCluster, task: Any, *, setup: bool) -> FakeJob:
        with self._lock:
            status = sky.JobStatus.PENDING if setup else sky.JobStatus.INIT
            job = FakeJob(id=max(c.jobs, default=0) + 1, name=task.name or "task", task=task, status=status)
            c.jobs[job.id] = job
            c.idle_since = time.time()
        threading.Thread(target=self._run_job, args=(c, job, setup), daemon=True).start()
        return job

    def _run_job(self, c: FakeCluster, job: FakeJob, setup: bool) -> None:
        if job.status == sky.JobStatus.INIT:  # the exec's submission, still in the background
            time.sleep(self.queue_seconds * self.scale)
            with self._lock:
                if job.status == sky.JobStatus.INIT:
                    job.status = sky.JobStatus.PENDING
        # a job waits until the GPUs it asks for are free (all of them when it names none)
        need = _gpu_demand(c, job.task)
        while not self._take_gpus(c, need):
            if job.status.is_terminal():  # cancelled, or its cluster preempted, while queued
                return
            time.sleep(0.01)
        try:
            self._run_job_holding_gpu(c, job, setup)
        finally:
            with self._lock:
                c.gpus_free += need

    def _take_gpus(self, c: FakeCluster, need: float) -> bool:
        with self._lock:
            if c.gpus_free + 1e-9 < need:
                return False
            c.gpus_free -= need
            return True

    def _run_job_holding_gpu(self, c: FakeCluster, job: FakeJob, setup: bool) -> None:
        if setup:
            job.status = sky.JobStatus.SETTING_UP
            time.sleep(self.setup_seconds * self.scale)
            if c.name in self._setup_failures:
                self._setup_failures.discard(c.name)
                job.lines.append("(setup pid=4242) ERROR: No matching distribution found for nightlab")
                job.lines.append(f"ERROR: Job {job.id}'s setup failed with return code 1 (pid=4242).")
                job.status = sky.JobStatus.FAILED_SETUP
                job.ended_at = time.time()
                return
        env = {
            "PATH": f"{c.home / 'bin'}:{Path(sys.executable).parent}:/usr/bin:/bin",
            "HOME": str(c.home),
            "LANG": "C.UTF-8",
            # the venv links to this Python's environment, and with it to this process's nightlab:
            # a PYTHONPATH that points at another checkout (a worktree) must count there too, or the
            # worker's code hash is not the controller's
            **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}),
            **{k: str(v) for k, v in (job.task.envs or {}).items()},
        }
        if (
            setup
            and self.prepare_data
            and env.get("NIGHTLAB_BUILTIN") == "1"
            and not self._prepare(c, job, env)
        ):
            return
        if job.status.is_terminal():  # cancelled while pending
            return
        job.proc = subprocess.Popen(
            ["bash", "-c", job.task.run or "true"],
            cwd=c.home / "sky_workdir",
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        job.status, job.started_at = sky.JobStatus.RUNNING, time.time()
        self._maybe_preempt(c, job)
        prefix = f"({job.name}, pid={job.proc.pid}) "
        for raw in job.proc.stdout:
            job.lines.append(prefix + raw.decode(errors="replace").rstrip("\n"))
        code = job.proc.wait()
        with self._lock:
            if not job.status.is_terminal():
                job.status = sky.JobStatus.SUCCEEDED if code == 0 else sky.JobStatus.FAILED
            job.ended_at = time.time()
            c.idle_since = time.time()

    def _prepare(self, c: FakeCluster, job: FakeJob, env: dict[str, str]) -> bool:
        """Set-up's data step, for real; False (the job FAILED_SETUP) when it fails."""
        # this process's nightlab is what set-up would have installed (the venv links to it)
        path = {"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}
        done = subprocess.run(
            [sys.executable, "-m", "nightlab.fleet.sky_task", "prepare"],
            cwd=c.home / "sky_workdir",
            env={**env, **path},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
        job.lines.extend(f"(setup pid=4242) {line}" for line in (done.stdout + done.stderr).splitlines())
        if done.returncode == 0:
            return True
        job.lines.append(f"ERROR: Job {job.id}'s setup failed with return code {done.returncode} (pid=4242).")
        job.status, job.ended_at = sky.JobStatus.FAILED_SETUP, time.time()
        return False

    def _maybe_preempt(self, c: FakeCluster, job: FakeJob) -> None:
        with self._lock:
            hit = next((p for p in self._preempt_jobs if p[0] in job.name), None)
            if hit is None:
                return
            self._preempt_jobs.remove(hit)
        timer = threading.Timer(hit[1], self.preempt, args=(c.name,))
        timer.daemon = True
        timer.start()

    def _kill(self, job: FakeJob) -> None:
        if job.proc is not None and job.proc.poll() is None:
            # the run script's `timeout` puts the command in a process group of its own
            try:
                tree = psutil.Process(job.proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                tree = []
            try:
                os.killpg(job.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            for proc in tree:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()


def _gpu_demand(c: FakeCluster, task: Any) -> float:
    """The GPUs a job takes on `c`: what its resources ask for, or the whole cluster when none."""
    resources = next(iter(task.resources), None)
    accelerators = getattr(resources, "accelerators", None)
    if not accelerators:
        return float(c.gpus)
    return min(float(c.gpus), float(next(iter(accelerators.values()))))


def _copy_file_mounts(mounts: dict[str, str] | None, home: Path) -> None:
    """Copy a task's file mounts of local files to their remote paths (`~` is the cluster's home)."""
    for remote, local in (mounts or {}).items():
        if not Path(local).is_file():
            continue
        dest = home / remote[2:] if remote.startswith("~/") else home / remote.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, dest)


def _sync_workdir(workdir: Any, dest: Path) -> None:
    """Copy a task's workdir as `sky launch` syncs it: the git-tracked files (no `.nightlab/`)."""
    if not isinstance(workdir, str) or not Path(workdir).is_dir():
        return
    src = Path(workdir)
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=src, capture_output=True, check=False)
    names = [n for n in listed.stdout.decode().split("\0") if n] if listed.returncode == 0 else []
    for name in names:
        if (src / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / name, dest / name)
