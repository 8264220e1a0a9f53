"""Machine health of a run, measured from outside the target: was it starved or throttled?

Under a wall-clock budget a run that gets half the CPU trains half the steps and scores
worse for reasons that have nothing to do with its code. The controller therefore samples
every local run while it runs and attaches a `Health` record to its result; a run whose
machine failed it beyond the thresholds below is `degraded`: recorded with its figures,
never judged, kept out of noise floors and incumbent figures, and re-run once.

CPU (every local run, Linux): every thread of every process of the run is read from
`/proc/<pid>/task/<tid>/schedstat` (nanoseconds on a CPU, nanoseconds runnable but waiting
for one). The run's processes are those the kill ends (`nightlab/procs.py`): the wrapper's tree
and every process carrying the attempt's environment mark, so the harness supervisor, bwrap and
train.py in sessions of their own all count. (Until 2026-12 the walk stopped at the supervisor:
a live run's ledger said 9.98 CPU-s where train.py had used 53.7.) From the last value seen of
every thread:

    cpu_share = CPU time / (wall x slot threads)   the share of its thread-seconds the run got
    got_share = CPU time / (CPU time + run-queue wait)   of the CPU it asked for, how much it got

`cpu_share` alone cannot tell a starved run from one that did not want the CPU (a target
that sleeps, waits on a GPU or on I/O), so the verdict uses `got_share`: the time a thread
was ready to run and no core took it is starvation and nothing else. A run is degraded when

    got_share < MIN_GOT_SHARE (0.7)   and   waited >= wait_floor(wall, threads)
    wait_floor = max(MIN_WAITED_SECONDS (0.5 s), MIN_WAITED_SHARE (0.1) x wall x slot threads)

0.7: a run that lost 30 % of its CPU trains ~30 % fewer steps under the budget; on the cpu
profile that moves val_bpb by far more than its noise floor (0.0046 at 464 steps; 75 steps
scored 0.900 instead of 0.306). Two 2-thread slots busy on 2 cores get 0.5 each and are
caught with margin. The wait floor is relative to the run: its threads must have waited a
tenth of the slot's thread-seconds, so a run that hardly asked for the CPU (it sleeps, waits on
I/O) is not judged on the little it waited, and a short run is judged like a long one (with
the former fixed 5 s floor a 4 s run that got 23 % of what it asked for passed as healthy).
Below 0.5 s it is a few scheduler ticks, never judged. The machine's load per core is
recorded beside it (`os.getloadavg`), for the reader: it counts the run itself.

A run on a local GPU slot is judged by its GPU only (its CPU figures are recorded): its CPU
threads mostly wait on the card, and on a many-GPU host torch's thread pools would read as
starvation.

NVIDIA GPUs (a local slot with a GPU index, when `nvidia-smi` is on PATH): SM clock, max
SM clock, utilisation and the active clock-throttle reasons, sampled every
GPU_SAMPLE_SECONDS by one thread for all GPUs. Degraded when, over the samples where the
GPU was busy (utilisation >= 50 %), the mean SM clock is below MIN_CLOCK_SHARE (0.8) of its
max, or a hardware/thermal slowdown reason (HW slowdown, SW/HW thermal, power brake) was
active in more than a MAX_SLOWDOWN_SHARE (0.2) of them. The software power cap alone is
normal at full load and only counts through the clock it costs.

Cost (bench/health_overhead.py, 2-core CPU): one CPU sample scans /proc once for the
processes of all running runs, reading each process's environment once in its life (its mark
cannot change but by an exec); the figure per run is in bench/RESULTS.md. The sampled
threads' last second is not seen (a thread that exits between samples keeps its last
sample), which is well under 1 % of a 300 s run.

Remote runs (SkyPilot) are sampled on their worker by `fleet/worker_health.py` with these same
samplers, per experiment (each lane's run by its own mark, its lane's threads and GPU); the
controller judges what comes back with the thresholds here (`HealthWatch.finish`). A remote run
whose worker sent no sample (an older worker, a lost job) has health `None`, never degraded.
stdlib only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nightlab import procs
from nightlab.fleet.capacity import capacity_problem, check_capacity, usable_cores  # noqa: F401 (their former home)
from nightlab.outcome import Outcome

MIN_GOT_SHARE = 0.7
# A shared CI machine cannot keep other jobs off its cores: there this variable (read by the
# controller at start) overrides `[fleet] min_cpu_share`, so the suite's ordinary runs are not
# re-run because a neighbour was busy. The threshold used is recorded in every run's health.
MIN_CPU_SHARE_ENV = "NIGHTLAB_MIN_CPU_SHARE"
MIN_WAITED_SHARE = 0.1  # of the slot's thread-seconds (wall x threads): see the module docstring
MIN_WAITED_SECONDS = 0.5
MIN_CLOCK_SHARE = 0.8
MAX_SLOWDOWN_SHARE = 0.2
BUSY_UTILISATION = 50.0
SAMPLE_SECONDS = 1.0
GPU_SAMPLE_SECONDS = 2.0

# NVML clock-throttle ("clock event") reason bits that mean the card slowed itself down
# (nvml.h: nvmlClocksThrottleReason*). 0x1 idle, 0x2 application clocks and 0x4 the
# software power cap are normal under load and count only through the clock they cost.
_SLOWDOWN_BITS = {0x8: "hw-slowdown", 0x20: "sw-thermal", 0x40: "hw-thermal", 0x80: "hw-power-brake"}
_REASON_BITS = {0x4: "sw-power-cap", **_SLOWDOWN_BITS}

_PROC = Path("/proc")


@dataclass(frozen=True)
class Health:
    """What the machine gave one run, and whether that makes the run `degraded`."""

    wall_seconds: float
    threads: int | None = None
    cpu_seconds: float | None = None
    waited_seconds: float | None = None
    cpu_share: float | None = None
    got_share: float | None = None
    load_per_core: float | None = None
    gpu: int | None = None
    sm_clock_mhz: float | None = None
    sm_clock_share: float | None = None
    throttle: dict[str, float] = field(default_factory=dict)  # reason -> share of busy samples
    samples: int = 0
    threshold: float | None = None  # the min_cpu_share it was judged by
    degraded: bool = False
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None and v != {}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Health:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def measurements(self) -> dict[str, Any]:
        """What was measured, without a verdict: what a remote worker reports (`from_report`)."""
        return {k: v for k, v in self.to_dict().items() if k not in _VERDICT}

    def with_gpu(self, samples: list[dict[str, float]], gpu: int) -> Health:
        """This health with one GPU's figures over `samples` (`gpu_health`)."""
        return Health(**{**asdict(self), **gpu_health(samples, gpu)})

    @classmethod
    def from_report(cls, data: Any) -> Health | None:
        """A remote worker's unjudged sample (`fleet/worker_health.py`), or None when malformed.

        It arrives on a log line, so nothing about it is trusted: only the measured fields, each of
        its type, and never a verdict (the controller judges it with its own thresholds).
        """
        if not isinstance(data, dict):
            return None

        def number(value: Any, whole: bool = False) -> bool:
            kinds = int if whole else (int, float)
            return isinstance(value, kinds) and not isinstance(value, bool) and value >= 0

        fields = cls.__dataclass_fields__
        measured = set(fields) - _VERDICT - {"throttle"}
        kept = {k: v for k, v in data.items() if k in measured and v is not None}
        throttle = data.get("throttle", {})
        if (
            not number(kept.get("wall_seconds"))
            or not all(number(v, whole=str(fields[k].type).startswith("int")) for k, v in kept.items())
            or not isinstance(throttle, dict)
            or not all(isinstance(k, str) and number(v) for k, v in throttle.items())
        ):
            return None
        return cls(**kept, throttle=dict(throttle))

    def summary(self) -> str:
        """One line for `show` and the dashboard."""
        parts = []
        if self.got_share is not None:
            parts.append(f"got {self.got_share:.0%} of the CPU time it was ready to use")
        if self.cpu_seconds is not None and self.threads:
            parts.append(
                f"used {self.cpu_seconds:.1f} CPU-s of {self.threads * self.wall_seconds:.0f} available "
                f"({self.threads}-core slot x {self.wall_seconds:.0f} s)"
            )
        if self.load_per_core is not None:
            parts.append(f"machine load {self.load_per_core:.2f} per core")
        if self.sm_clock_share is not None:
            parts.append(f"GPU {self.gpu} SM clock {self.sm_clock_share:.0%} of max")
        if self.throttle:
            parts.append("throttled " + ", ".join(f"{k} {v:.0%}" for k, v in self.throttle.items()))
        text = "; ".join(parts) or "not sampled"
        return f"degraded ({text}): {self.reason}" if self.degraded else f"healthy ({text})"


# what `judge` adds to a sample; every other field of `Health` is measured
_VERDICT = frozenset({"threshold", "degraded", "reason"})


# ---------------------------------------------------------------------------- CPU


def _threads_of(pid: int) -> dict[tuple[int, int], tuple[int, int]]:
    out = {}
    try:
        tids = os.listdir(_PROC / str(pid) / "task")
    except OSError:
        return out
    for tid in tids:
        try:
            run, wait = (_PROC / str(pid) / "task" / tid / "schedstat").read_text().split()[:2]
        except (OSError, ValueError):
            continue
        out[(pid, int(tid))] = (int(run), int(wait))
    return out


class MarkCache:
    """`procs.mark_of` with memory: each process's environment is read once (pid + start time name it).

    A forked child inherits its parent's environment, so a process is marked from its first
    moment (only the wrapper gets its mark at its exec, and the tree finds it as the root);
    reading every environment once a second would cost ~30 us per process on the box.
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[int, int], str | None] = {}
        self._table: dict[int, tuple[int, int, int]] = {}

    def renew(self, table: dict[int, tuple[int, int, int]]) -> None:
        self._table = table
        live = {(pid, row[2]) for pid, row in table.items()}
        self._seen = {key: mark for key, mark in self._seen.items() if key in live}

    def __call__(self, pid: int) -> str | None:
        key = (pid, self._table[pid][2])
        if key not in self._seen:
            self._seen[key] = procs.mark_of(pid)
        return self._seen[key]


def scan_runs(
    runs: dict[Any, tuple[int | None, str | None]], marks: MarkCache | None = None
) -> dict[Any, dict[tuple[int, int], tuple[int, int]]]:
    """(run_ns, wait_ns) of every thread of every process of the given runs, in one /proc pass.

    `runs` maps a key to the run's (wrapper pid, mark): its processes are the wrapper's tree and
    session and every process carrying its mark (`procs.run_processes`, the rule the kill uses),
    so the supervisor, bwrap and train.py in their own sessions all count. Empty where /proc has
    no schedstat (macOS, a kernel without CONFIG_SCHED_INFO): those runs are simply not judged.
    """
    found: dict[Any, dict[tuple[int, int], tuple[int, int]]] = {key: {} for key in runs}
    if not runs or not _PROC.is_dir():
        return found
    table = procs.table()
    marks = marks or MarkCache()
    marks.renew(table)
    for key, (root, mark) in runs.items():
        for pid in procs.run_processes(root, mark, procs=table, marks=marks):
            found[key].update(_threads_of(pid))
    return found


class CpuSampler:
    """Accumulates one run's threads (last value seen of each) and the machine's load."""

    def __init__(self, *, root: int | None, mark: str | None, threads: int, started_at: float) -> None:
        self.root = root
        self.mark = mark
        self.threads = max(1, threads)
        self.started_at = started_at
        self._tasks: dict[tuple[int, int], tuple[int, int]] = {}
        self._loads: list[float] = []
        self._cores = (
            len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        )

    def add(self, tasks: dict[tuple[int, int], tuple[int, int]]) -> None:
        # schedstat counters are cumulative per thread, so the latest value is the whole story
        self._tasks.update(tasks)
        try:
            self._loads.append(os.getloadavg()[0] / self._cores)
        except OSError:
            pass

    def health(self, *, ended_at: float) -> Health:
        """The run's CPU health (not yet judged: see `judge`)."""
        wall = max(ended_at - self.started_at, 1e-9)
        if not self._tasks:
            return Health(wall_seconds=wall, threads=self.threads, samples=len(self._loads))
        cpu = sum(r for r, _ in self._tasks.values()) / 1e9
        waited = sum(w for _, w in self._tasks.values()) / 1e9
        return Health(
            wall_seconds=round(wall, 3),
            threads=self.threads,
            cpu_seconds=round(cpu, 3),
            waited_seconds=round(waited, 3),
            cpu_share=round(cpu / (wall * self.threads), 4),
            got_share=round(cpu / (cpu + waited), 4) if cpu + waited > 0 else None,
            load_per_core=round(sum(self._loads) / len(self._loads), 3) if self._loads else None,
            samples=len(self._loads),
        )


# ---------------------------------------------------------------------------- GPU


def parse_nvidia_smi(text: str) -> dict[int, dict[str, float]]:
    """Rows of `nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,utilization.gpu,
    clocks_throttle_reasons.active --format=csv,noheader,nounits`, by GPU index."""
    out: dict[int, dict[str, float]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 5 or not cells[0].isdigit():
            continue
        try:
            reasons = int(cells[4], 16) if cells[4].lower().startswith("0x") else int(cells[4] or 0)
            out[int(cells[0])] = {
                "sm": float(cells[1]),
                "max_sm": float(cells[2]),
                "util": float(cells[3]),
                "reasons": float(reasons),
            }
        except ValueError:  # `[N/A]` on cards that do not report a field
            continue
    return out


_QUERY = "index,clocks.sm,clocks.max.sm,utilization.gpu,clocks_throttle_reasons.active"


class GpuWatcher:
    """One thread that samples every local GPU with `nvidia-smi` (absent: samples nothing)."""

    def __init__(self, *, interval: float = GPU_SAMPLE_SECONDS, command: str | None = None) -> None:
        self.interval = interval
        self.command = command or shutil.which("nvidia-smi")
        self._lock = threading.Lock()
        self._samples: dict[int, list[dict[str, float]]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self.command is not None

    def start(self) -> None:
        if self.available and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="nightlab-gpu-health", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def sample_once(self) -> None:
        """Take one sample of every GPU now."""
        try:
            proc = subprocess.run(
                [str(self.command), f"--query-gpu={_QUERY}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return
        if proc.returncode != 0:
            return
        now = time.time()
        with self._lock:
            for index, row in parse_nvidia_smi(proc.stdout).items():
                self._samples.setdefault(index, []).append({**row, "ts": now})
                del self._samples[index][:-100_000]  # a week at 2 s; never unbounded

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample_once()

    def indices(self) -> list[int]:
        """The GPU indices sampled so far."""
        with self._lock:
            return sorted(self._samples)

    def samples(self, gpu: int, since: float, until: float) -> list[dict[str, float]]:
        with self._lock:
            return [s for s in self._samples.get(gpu, []) if since <= s["ts"] <= until]


def gpu_health(samples: list[dict[str, float]], gpu: int) -> dict[str, Any]:
    """Clock share and throttle reasons over the busy samples of one GPU (fields of `Health`)."""
    busy = [s for s in samples if s["util"] >= BUSY_UTILISATION] or []
    if not busy:
        return {"gpu": gpu}
    clocks = [s["sm"] / s["max_sm"] for s in busy if s["max_sm"] > 0]
    throttle = {}
    for bit, name in _REASON_BITS.items():
        share = sum(1 for s in busy if int(s["reasons"]) & bit) / len(busy)
        if share > 0:
            throttle[name] = round(share, 3)
    return {
        "gpu": gpu,
        "sm_clock_mhz": round(sum(s["sm"] for s in busy) / len(busy), 1),
        "sm_clock_share": round(sum(clocks) / len(clocks), 4) if clocks else None,
        "throttle": throttle,
    }


# ---------------------------------------------------------------------------- the rule


def wait_floor(wall_seconds: float, threads: int) -> float:
    """Seconds a run's threads must have waited for a core, in all, before it can be judged starved."""
    return max(MIN_WAITED_SECONDS, MIN_WAITED_SHARE * wall_seconds * max(1, threads))


def judge(
    health: Health, *, min_got_share: float = MIN_GOT_SHARE, min_clock_share: float = MIN_CLOCK_SHARE
) -> Health:
    """`health` with `degraded` and `reason` set by the thresholds of the module docstring.

    `min_got_share` / `min_clock_share` of 0 turn that check off (`[fleet] health`).
    """
    reasons = []
    if health.got_share is not None:
        health = Health(**{**asdict(health), "threshold": min_got_share})
    if (
        health.got_share is not None
        and health.waited_seconds is not None
        and health.got_share < min_got_share
        and health.waited_seconds >= wait_floor(health.wall_seconds, health.threads or 1)
    ):
        load = f" (load {health.load_per_core:.2f} per core)" if health.load_per_core is not None else ""
        reasons.append(
            f"starved: it got {health.got_share:.0%} of the CPU time it was ready to use "
            f"({min_got_share:.0%} needed); its processes waited {health.waited_seconds:.1f} s in all "
            f"for a free core during its {health.wall_seconds:.0f} s run on a {health.threads}-core slot: "
            f"the machine was busy{load}; stop other work on it or run fewer slots"
        )
    if health.sm_clock_share is not None and health.sm_clock_share < min_clock_share:
        reasons.append(
            f"throttled: GPU {health.gpu} SM clock {health.sm_clock_share:.0%} of max "
            f"(threshold {min_clock_share:.0%})"
        )
    slowdown = {k: v for k, v in health.throttle.items() if k in _SLOWDOWN_BITS.values()}
    if min_clock_share > 0 and slowdown and max(slowdown.values()) > MAX_SLOWDOWN_SHARE:
        reasons.append("throttled: " + ", ".join(f"{k} in {v:.0%} of samples" for k, v in slowdown.items()))
    if not reasons:
        return Health(**{**asdict(health), "degraded": False, "reason": None})
    return Health(**{**asdict(health), "degraded": True, "reason": "; ".join(reasons)})


# ---------------------------------------------------------------------------- the controller's side


def cpu_share_override(configured: float) -> float:
    """`[fleet] min_cpu_share`, or `NIGHTLAB_MIN_CPU_SHARE` when set to a number in [0, 1]."""
    text = os.environ.get(MIN_CPU_SHARE_ENV, "").strip()
    if not text:
        return configured
    try:
        value = float(text)
    except ValueError:
        return configured
    return value if 0 <= value <= 1 else configured


def health_may_judge(outcome: Outcome, metrics: dict[str, Any]) -> bool:
    """Whether a starved machine may turn this run's outcome into `degraded` (re-run once, never judged).

    An `ok` run, and one `invalid` only because its hand-in came after the grace (harness/serve.py):
    a machine that starves training starves export and save as much, so the late hand-in of an
    honest run on it says nothing about the code. The re-run is judged on its own.
    """
    if outcome is Outcome.OK:
        return True
    delay, grace = metrics.get("handin_delay_seconds"), metrics.get("handin_grace_seconds")
    numbers = isinstance(delay, (int, float)) and isinstance(grace, (int, float))
    return outcome is Outcome.INVALID and numbers and delay > grace


class HealthWatch:
    """The controller's view of its local runs' health: sample, judge, and re-run the degraded once.

    `config` is the lab's `FleetConfig` (thresholds); `slots` the controller's worker slots.
    """

    def __init__(self, config: Any, slots: list[Any], *, gpus: GpuWatcher | None = None) -> None:
        self.min_got_share = cpu_share_override(config.min_cpu_share)
        self.min_clock_share = config.min_clock_share
        self._cpu: dict[int, CpuSampler] = {}
        self._marks = MarkCache()
        self._gpu_of: dict[int, tuple[int, float]] = {}  # attempt id -> (gpu index, started at)
        self._avoid: dict[str, str] = {}  # queued re-run id -> the worker whose run was degraded
        self._running_reruns: set[int] = set()  # attempt ids of re-runs in flight
        self.slots = list(slots)
        self.gpus = gpus or GpuWatcher()
        if any("gpu" in s.info for s in slots if s.backend == "local"):
            self.gpus.start()

    def update_slots(self, slots: list[Any], config: Any) -> None:
        self.slots = list(slots)
        self.min_got_share = cpu_share_override(config.min_cpu_share)
        self.min_clock_share = config.min_clock_share
        if any("gpu" in s.info for s in slots if s.backend == "local"):
            self.gpus.start()

    def watch(self, attempt: Any, slot: Any, handle: dict[str, Any]) -> None:
        """Start sampling a launched (or re-attached) local attempt."""
        if self._avoid.pop(attempt.experiment_id, None) is not None:
            self._running_reruns.add(attempt.id)
        if slot.backend != "local" or not handle.get("pgid"):
            return
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        threads = int(slot.info.get("threads") or (1 if "gpu" in slot.info else cores))
        self._cpu[attempt.id] = CpuSampler(
            root=int(handle["pgid"]), mark=handle.get("mark"), threads=threads, started_at=attempt.started_at
        )
        if "gpu" in slot.info:
            # a GPU run is judged by its GPU: its CPU threads mostly wait on the card, and torch's
            # idle pools on a many-GPU host would read as starvation; the CPU figures stay recorded
            self._gpu_of[attempt.id] = (int(slot.info["gpu"]), attempt.started_at)

    def sample(self) -> None:
        """One /proc pass for every watched run (the controller calls it once per heartbeat)."""
        if not self._cpu:
            return
        found = scan_runs({key: (s.root, s.mark) for key, s in self._cpu.items()}, self._marks)
        for key, sampler in self._cpu.items():
            sampler.add(found[key])

    def finish(self, attempt: Any, reported: dict[str, Any] | None = None) -> Health | None:
        """The judged health of an attempt that ended; None when nothing sampled it.

        `reported`: what a remote worker's sampler measured (`RunExit.health`); the same rule
        judges it, by its GPU when the worker saw the lane's GPU, else by its CPU.
        """
        self._running_reruns.discard(attempt.id)
        sampler = self._cpu.pop(attempt.id, None)
        gpu = self._gpu_of.pop(attempt.id, None)
        if sampler is None:
            remote = Health.from_report(reported) if reported is not None else None
            if remote is None:
                return None
            cpu_floor = 0 if remote.gpu is not None else self.min_got_share
            return judge(remote, min_got_share=cpu_floor, min_clock_share=self.min_clock_share)
        now = time.time()
        health = sampler.health(ended_at=now)
        if gpu is None:
            return judge(health, min_got_share=self.min_got_share, min_clock_share=self.min_clock_share)
        index, since = gpu
        health = health.with_gpu(self.gpus.samples(index, since, now), index)
        return judge(health, min_got_share=0, min_clock_share=self.min_clock_share)

    def lease_rule(self, slot: Any, busy: list[Any]) -> tuple[bool, list[str]]:
        """Whether `slot` may lease now, and the queued re-runs it must skip.

        A re-run needs a healthy slot. On the local CPU that means the machine's cores: a
        re-run is leased only where the threads of the busy local CPU slots plus this slot's
        fit in the usable cores, and while a re-run runs no CPU slot starts work that would
        not fit beside it. Elsewhere (GPUs, remote) the re-run skips the slot that degraded
        its first run, when the tier has another.
        """
        if slot.backend == "local" and "gpu" not in slot.info:
            used = sum(
                int(s.info.get("threads") or 1) for s in busy if s.backend == "local" and "gpu" not in s.info
            )
            fits = used + int(slot.info.get("threads") or 1) <= usable_cores()
            if not fits and self._running_reruns:
                return False, []
            return True, ([] if fits else sorted(self._avoid))
        others = any(s.tier == slot.tier and s.name != slot.name for s in self.slots)
        return True, ([rid for rid, worker in self._avoid.items() if worker == slot.name] if others else [])

    def rerun(self, ledger: Any, lab_dir: Path, exp: Any, slot: Any) -> str | None:
        """Queue the one re-run of a degraded experiment (not of a re-run); returns its id."""
        from nightlab import evidence, snapshots
        from nightlab.ledger import NewExperiment

        if ledger.events(experiment_id=exp.id, kinds=["rerun"]):
            ledger.log_event("degraded-again", exp.id, worker=slot.name)
            return None
        new = NewExperiment(
            snapshot=exp.snapshot,
            identity=exp.identity,
            parent=exp.parent,
            description=f"re-run of {exp.id} (degraded): {exp.description}",
            tier=exp.tier,
            seed=exp.seed,
            wave=exp.wave,
            priority=exp.priority + 1,  # before new work: the wave it belongs to waits for it
            params=dict(exp.params),
            source=exp.source,  # waves tell candidates, noise runs and re-measurements by source
            epoch=exp.epoch,
            rerun_of=exp.id,
        )

        def make_ref(experiments: list[Any]) -> None:
            snapshots.set_ref(lab_dir, experiments[0].id, exp.snapshot)

        [queued] = ledger.add_experiments([new], before_commit=make_ref, taken=evidence.highest_seq(lab_dir))
        ledger.log_event("rerun", queued.id, of=exp.id, worker=slot.name)
        self._avoid[queued.id] = slot.name
        return queued.id

    def close(self) -> None:
        self.gpus.stop()
