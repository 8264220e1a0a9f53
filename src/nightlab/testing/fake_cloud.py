"""The machines behind the fake SkyPilot SDK (`fake_sky.py`): its clusters and the jobs they run.

A fake cluster is a directory standing in for its home: the task's `workdir` (the lab) is
copied to `sky_workdir` at launch, its git-tracked files only (SkyPilot honours .gitignore),
`nightlab-venv` links to this Python's environment (what set-up would have installed) and
`bin/nvidia-smi` prints the GPU name of the cluster's accelerator. Jobs run for real: the
task's `run` script under bash with the task's envs and HOME set to the cluster's directory,
and every output line goes to the job log with SkyPilot's `(name, pid=N) ` prefix. So the
backend's payload, run script, timeout, summary and exit status are all exercised end to end.

Jobs on one cluster share its GPUs as SkyPilot's scheduler does: a job asking for `H100:1` on an
`H100:4` cluster runs beside three others (a fraction, `H100:0.5`, beside another on the same
unit), a job asking for none or all of them runs alone, and a job that does not fit waits
PENDING, as in SkyPilot's job queue. Like Ray, the fake sets no device: which GPU a job uses is
the run script's pin (`NIGHTLAB_GPU`). An exec'd job starts INIT (its submission goes on in the
background for `queue_seconds`, as on a Slurm cluster). Set-up is simulated (a delay), not run;
the task's `file_mounts` are copied into the cluster's home at every launch, and with
`prepare_data=True` set-up's data step runs for real (`python -m nightlab.fleet.worker_setup
prepare` in `sky_workdir`, for a built-in target), into the cluster's own data root.

The cloud's own faults: `fail_setup(cluster)`, `preempt(cluster)`, `preempt_job(name_part,
after)`. Autostop: a cluster with no running job for its `idle_minutes_to_autostop` (scaled)
stops itself (or goes away with `down`), seen at the next call that looks (`up`, `sweep`).
"""

from __future__ import annotations

import contextlib
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

from nightlab.fleet.skypilot.core import cpu_count

GPU_NAMES = {"H100": "NVIDIA H100 80GB HBM3", "H200": "NVIDIA H200", "A100": "NVIDIA A100-SXM4-80GB"}
# Illustrative on-demand prices ($/h for one GPU); a real handle prices from SkyPilot's catalog.
PRICES = {"H100": 2.99, "H200": 3.79, "A100": 1.79}
# A fake node's CPUs when the launch names none (a cloud's 8-GPU H100 instance has ~26 vCPUs a GPU;
# 8 keeps the arithmetic plain). `launched_resources.cpus` reports it, as SkyPilot's handle does.
CPUS_PER_GPU = 8
# Ray (Kubernetes, clouds) counts every exec job as half a CPU whatever the task asks (SkyPilot 0.14)
RAY_JOB_CPUS = 0.5


@dataclass
class _PricedResources:
    """What a launched handle's `launched_resources` offers the cost code."""

    accelerators: dict[str, int] | None
    price: float
    cpus: str | None = None

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
    gpus_free: float = 1.0  # what running jobs have not taken (`_take`)
    cpus: int = CPUS_PER_GPU
    cpus_free: float = float(CPUS_PER_GPU)
    slurm: bool = False  # Slurm's accounting: a job's step holds the CPUs it asks for, else all of them


class FakeCloud:
    """The clusters of a `FakeSky` and their jobs (module docstring).

    Args:
        root: directory under which each fake cluster gets its home.
        lock: the one lock of the fake (its SDK calls and this simulation share it).
        scale: multiplies every latency below (seconds of the real thing).
        setup_seconds: the set-up script's time.
        queue_seconds: from an exec's answer to its job being queued (PENDING) on the cluster.
        prepare_data: run set-up's data step for real (module docstring).
    """

    def __init__(
        self,
        root: Path,
        lock: threading.RLock,
        *,
        scale: float,
        setup_seconds: float,
        queue_seconds: float,
        prepare_data: bool,
    ) -> None:
        self.root = Path(root)
        self.lock = lock
        self.scale = scale
        self.setup_seconds = setup_seconds
        self.queue_seconds = queue_seconds
        self.prepare_data = prepare_data
        self.clusters: dict[str, FakeCluster] = {}
        self._setup_failures: set[str] = set()
        self._preempt_jobs: list[tuple[str, float]] = []

    # ------------------------------------------------------------------ faults

    def fail_setup(self, cluster: str) -> None:
        """The next launch of `cluster` ends with its set-up failing (job FAILED_SETUP)."""
        self._setup_failures.add(cluster)

    def preempt_job(self, name_part: str, after: float = 0.0) -> None:
        """Preempt the cluster of the first job whose name contains `name_part`, `after` s into it."""
        self._preempt_jobs.append((name_part, after))

    def preempt(self, cluster: str) -> None:
        """The cloud takes the cluster back: its jobs die and it is no longer up."""
        with self.lock:
            c = self.clusters.pop(cluster, None)
        if c is None:
            return
        for job in c.jobs.values():
            kill(job)
            if not job.status.is_terminal():
                job.status = sky.JobStatus.FAILED_DRIVER

    def stop_jobs(self) -> None:
        """Kill every job process still running, by PID (a test's teardown, also after a failure)."""
        with self.lock:
            jobs = [job for c in self.clusters.values() for job in c.jobs.values()]
        for job in jobs:
            kill(job)

    # ------------------------------------------------------------------ clusters

    def provision(self, name: str, task: Any, *, autostop: int | None, down: bool) -> FakeCluster:
        """The cluster of a launch, made on the first one, UP now, with the task's file mounts."""
        with self.lock:
            c = self.clusters.get(name)
            if c is None:
                c = self._new_cluster(name, task)
            c.status = sky.ClusterStatus.UP
            c.autostop, c.autodown, c.idle_since = autostop, down, time.time()
            _copy_file_mounts(task.file_mounts, c.home)
        return c

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
        count = next(iter(resources.accelerators.values())) if resources.accelerators else 1
        gpus = max(1, int(count))
        cpus = int(cpu_count(resources.cpus) or CPUS_PER_GPU * gpus)
        handle = SimpleNamespace(
            cluster_name=name,
            launched_nodes=1,
            launched_resources=_PricedResources(
                resources.accelerators, PRICES.get(accel or "", 0.0), str(cpus)
            ),
        )
        c = FakeCluster(
            name=name,
            home=home,
            task=task,
            accelerator=accel,
            handle=handle,
            gpus=gpus,
            gpus_free=float(gpus),
            cpus=cpus,
            cpus_free=float(cpus),
            slurm=resources.infra.cloud == "Slurm",
        )
        self.clusters[name] = c
        return c

    def up(self, name: str) -> FakeCluster:
        """The cluster, when it is UP; SkyPilot's errors otherwise."""
        self.sweep()
        with self.lock:
            c = self.clusters.get(name)
        if c is None:
            raise exceptions.ClusterDoesNotExist(f"Cluster {name!r} does not exist.")
        if c.status != sky.ClusterStatus.UP:
            raise exceptions.ClusterNotUpError(f"Cluster {name!r} is not up.", cluster_status=c.status)
        return c

    def remove(self, name: str) -> None:
        """`sky down`: the cluster's jobs die and its home goes."""
        with self.lock:
            c = self.clusters.pop(name, None)
        if c is None:
            raise exceptions.ClusterDoesNotExist(f"Cluster {name!r} does not exist.")
        for job in c.jobs.values():
            kill(job)
        shutil.rmtree(c.home, ignore_errors=True)

    def sweep(self) -> None:
        """Autostop the clusters idle for their `autostop` minutes (scaled)."""
        now = time.time()
        with self.lock:
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

    # ------------------------------------------------------------------ jobs

    def add_job(self, c: FakeCluster, task: Any, *, setup: bool) -> FakeJob:
        """Queue a job on `c` (a launch's set-up job, or an exec's, which starts INIT) and run it."""
        with self.lock:
            status = sky.JobStatus.PENDING if setup else sky.JobStatus.INIT
            job = FakeJob(id=max(c.jobs, default=0) + 1, name=task.name or "task", task=task, status=status)
            c.jobs[job.id] = job
            c.idle_since = time.time()
        threading.Thread(target=self._run_job, args=(c, job, setup), daemon=True).start()
        return job

    def _run_job(self, c: FakeCluster, job: FakeJob, setup: bool) -> None:
        if job.status == sky.JobStatus.INIT:  # the exec's submission, still in the background
            time.sleep(self.queue_seconds * self.scale)
            self._advance(job, sky.JobStatus.PENDING)
        # a job waits until the GPUs and CPUs it asks for are free (`_gpu_demand`, `_cpu_demand`)
        gpus, cpus = _gpu_demand(c, job.task), _cpu_demand(c, job.task)
        while not self._take(c, gpus, cpus):
            if job.status.is_terminal():  # cancelled, or its cluster preempted, while queued
                return
            time.sleep(0.01)
        try:
            self._run_job_holding_gpu(c, job, setup)
        finally:
            with self.lock:
                c.gpus_free += gpus
                c.cpus_free += cpus

    def _advance(self, job: FakeJob, status: Any) -> bool:
        """Move the job on to `status` unless it ended (a cancel or a preemption); False when it had.

        Under the lock a cancel takes too, so a job thread never overwrites a CANCELLED.
        """
        with self.lock:
            if job.status.is_terminal():
                return False
            job.status = status
            if status == sky.JobStatus.RUNNING:
                job.started_at = time.time()
            return True

    def _take(self, c: FakeCluster, gpus: float, cpus: float) -> bool:
        with self.lock:
            if c.gpus_free + 1e-9 < gpus or c.cpus_free + 1e-9 < cpus:
                return False
            c.gpus_free -= gpus
            c.cpus_free -= cpus
            return True

    def _run_job_holding_gpu(self, c: FakeCluster, job: FakeJob, setup: bool) -> None:
        if setup:
            if not self._advance(job, sky.JobStatus.SETTING_UP):  # cancelled while it took its GPUs
                return
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
        # a cancel can land while the process starts (slow under load): it then finds the job
        # still PENDING and no process to kill
        if not self._advance(job, sky.JobStatus.RUNNING):
            kill(job)
            job.proc.wait()
            job.proc.stdout.close()
            with self.lock:
                job.ended_at = c.idle_since = time.time()
            return
        self._maybe_preempt(c, job)
        prefix = f"({job.name}, pid={job.proc.pid}) "
        for raw in job.proc.stdout:
            job.lines.append(prefix + raw.decode(errors="replace").rstrip("\n"))
        code = job.proc.wait()
        with self.lock:
            if not job.status.is_terminal():
                job.status = sky.JobStatus.SUCCEEDED if code == 0 else sky.JobStatus.FAILED
            job.ended_at = time.time()
            c.idle_since = time.time()

    def _prepare(self, c: FakeCluster, job: FakeJob, env: dict[str, str]) -> bool:
        """Set-up's data step, for real; False (the job FAILED_SETUP) when it fails."""
        # this process's nightlab is what set-up would have installed (the venv links to it)
        path = {"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}
        done = subprocess.run(
            [sys.executable, "-m", "nightlab.fleet.worker_setup", "prepare"],
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
        with self.lock:
            hit = next((p for p in self._preempt_jobs if p[0] in job.name), None)
            if hit is None:
                return
            self._preempt_jobs.remove(hit)
        timer = threading.Timer(hit[1], self.preempt, args=(c.name,))
        timer.daemon = True
        timer.start()


def kill(job: FakeJob) -> None:
    """Kill a job's processes, the run script's own process group too, by PID."""
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


def _cpu_demand(c: FakeCluster, task: Any) -> float:
    """The CPUs a job holds on `c`: on Slurm its step's `--cpus-per-task`, the task's `cpus`, else
    every CPU of the cluster (SkyPilot 0.14, `_get_task_demands_dict`: measured on the real SkyPilot,
    a second lane's runner stayed PENDING behind the first); on Ray half a CPU, whatever it asks."""
    if not c.slurm:
        return RAY_JOB_CPUS
    resources = next(iter(task.resources), None)
    return float(min(c.cpus, cpu_count(getattr(resources, "cpus", None)) or c.cpus))


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
