"""The local backend: each attempt is a process group on this machine.

The target runs under a tiny shell wrapper in its own session, with stdout and stderr
going straight to `log.txt` and its exit status written to a file when it ends. So the
run does not depend on the controller: if the controller is killed (even with SIGKILL),
the run goes on, and the next controller finds its status file, or its live process,
and takes over. A run whose process is gone without a status file died from outside
(`infra`).

No process of a run outlives it: every one carries `NIGHTLAB_ATTEMPT=<the attempt's folder>` in
its environment (`nightlab/procs.py`), which a session of its own or a dead parent does not
remove. A kill (timeout, cancel, `fleet stop`) ends every marked process and waits until they
are gone, and an end is reported only once nothing marked is left (what is left is killed
first), so a retry never starts beside its old attempt, even after a controller restart.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from nightlab import procs
from nightlab.config import PoolConfig
from nightlab.fleet.backend import BaseBackend, RunExit, RunSpec, WorkerSlot
from nightlab.harness.names import MEASUREMENT_OVERRIDES
from nightlab.lifecycle import alive
from nightlab.snapshots import materialise

_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def local_slots(pool: PoolConfig, *, cpu_slots: int | None = None) -> list[WorkerSlot]:
    """The worker slots of a local pool: one per GPU, or N CPU slots with their thread counts."""
    if pool.gpus:
        return [
            WorkerSlot(
                name=f"{pool.tier}-gpu{g}",
                tier=pool.tier,
                backend="local",
                env={"CUDA_VISIBLE_DEVICES": str(g)},
                info={"gpu": g},
            )
            for g in pool.gpus
        ]
    n = cpu_slots or pool.slots
    # the cores this process may use (taskset, a container's cpuset), not the machine's count
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = pool.threads or max(1, cores // n)
    env = {var: str(threads) for var in _THREAD_VARS}
    env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU slot must not grab a GPU behind the fleet's back
    return [
        WorkerSlot(
            name=f"{pool.tier}-{i}", tier=pool.tier, backend="local", env=env, info={"threads": threads}
        )
        for i in range(n)
    ]


def _find_pid(marker: str) -> int | None:
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    return int(entry.name)
            except OSError:
                continue
    return None


def _mark(spec: RunSpec) -> str:
    """The attempt's mark: its folder, unique on this machine across labs and attempts."""
    return str(spec.run_dir.resolve())


def _left_over(spec: RunSpec) -> bool:
    """Kill what an ended run left running; True while there was any (its end waits for them)."""
    left = procs.run_processes(None, _mark(spec))
    procs.signal_all(left, signal.SIGKILL)
    return bool(left)


class LocalBackend(BaseBackend):
    """Runs attempts as detached process groups (see the module docstring)."""

    name = "local"

    def __init__(self) -> None:
        self._children: dict[int, subprocess.Popen] = {}

    def launch(self, slot: WorkerSlot, spec: RunSpec) -> dict[str, Any]:
        work = spec.run_dir / "work"
        if work.exists():
            shutil.rmtree(work)
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        materialise(spec.lab_dir, spec.snapshot, work)
        script = spec.run_dir / "run.sh"
        # The subshell keeps a target's own `exit` from skipping the status write;
        # the tmp + mv makes the status file appear whole or not at all.
        script.write_text(
            f"cd {shlex.quote(str(work))} || exit 97\n"
            f"(\n{spec.command}\n)\n"
            "code=$?\n"
            f"echo $code > {shlex.quote(str(spec.run_dir / 'exit.tmp'))} && "
            f"mv {shlex.quote(str(spec.run_dir / 'exit.tmp'))} {shlex.quote(str(spec.run_dir / 'exit'))}\n"
            "exit $code\n"
        )
        # test and tune overrides of the built-in target must never reach a measured run,
        # whoever started the controller with them in their environment
        env = {k: v for k, v in os.environ.items() if k not in MEASUREMENT_OVERRIDES}
        env.update({**slot.env, **spec.env})
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        env["PYTHONUNBUFFERED"] = "1"
        env[procs.MARK] = _mark(spec)
        with open(spec.log_path, "ab") as log:
            proc = subprocess.Popen(
                ["/bin/sh", str(script)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self._children[proc.pid] = proc
        return {"pid": proc.pid, "pgid": proc.pid, "marker": str(script), "mark": _mark(spec)}

    def poll(self, slot: WorkerSlot, spec: RunSpec, handle: dict[str, Any]) -> RunExit | None:
        status_file = spec.run_dir / "exit"
        marker = str(spec.run_dir / "run.sh")
        # no pid: a controller died between launching and recording the handle
        pid = handle.get("pid") or _find_pid(marker)
        child = self._children.get(pid) if pid else None
        if child is not None:
            code = child.poll()
            if code is None or _left_over(spec):
                return None
            del self._children[pid]
            if status_file.exists():
                return RunExit(int(status_file.read_text().strip() or "1"))
            # the wrapper itself was killed: report the signal the way the shell would
            return RunExit(code if code >= 0 else 128 - code)
        if status_file.exists():
            return None if _left_over(spec) else RunExit(int(status_file.read_text().strip() or "1"))
        if pid and alive(pid, marker=marker):  # ours, not a recycled pid of something else
            return None
        if _left_over(spec):
            return None
        if status_file.exists():  # it ended between the two checks
            return RunExit(int(status_file.read_text().strip() or "1"))
        if (spec.run_dir / "exit.tmp").exists():
            # the wrapper reached its last line but could not write 3 bytes: the disk was full
            return RunExit(
                None, lost=True, detail="the run could not write its exit status: the disk was full"
            )
        return RunExit(None, lost=True, detail="process gone without an exit status")

    def kill(self, slot: WorkerSlot, spec: RunSpec, handle: dict[str, Any]) -> None:
        """SIGKILL the run's group and every process of the run, and wait until they are gone."""
        pgid = handle.get("pgid") or _find_pid(str(spec.run_dir / "run.sh"))
        if pgid:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        procs.end_run(None, _mark(spec))  # the group is dead: the mark finds who left it

    def cleanup(self, spec: RunSpec) -> None:
        # the snapshot stays in git; the materialised copy is only disk
        shutil.rmtree(spec.run_dir / "work", ignore_errors=True)
