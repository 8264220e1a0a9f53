"""Machine health of one remote run, sampled on the worker beside it (`fleet/health.py`'s rules).

A SkyPilot worker runs each experiment through `fleet/templates/run.sh` (by `sky exec` or by the
resident runner); the controller cannot see that node's /proc or its GPUs. So the run script
starts this sampler next to the command, once the run holds its lane's lock:

    python -m nightlab.fleet.worker_health --mark M --threads N --exclude PID... --out FILE

It samples every process carrying the run's mark (`procs.MARK`, the same rule the local
controller and the resident runner's kill use; the run script's own shell and the code hasher
carry it too and are excluded) once a second, and every GPU the node shows with `nvidia-smi`,
until SIGTERM; then it writes the run's *unjudged* `Health` as JSON. The run script prints it
base64 on its `nightlab-health:` line after the command ended, like the score, and the
controller judges it with its own thresholds (`HealthWatch.finish`): one rule for local and
remote runs, and no threshold lives on the worker.

Per experiment on a multi-GPU node: each lane's run has its own mark and sampler; `--threads`
is the lane's CPU share (`NIGHTLAB_THREADS`), and the GPU judged is the lane's
(`pick_gpu`). The report vouches for what the sandbox vouches for: in the sandbox's PID
namespace a run cannot see the sampler; unsandboxed it can kill it or print a line of its own
after it (docs/integrity.md), as it can for its score.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from pathlib import Path

from nightlab import procs
from nightlab.atomic import atomic_write_json
from nightlab.fleet.capacity import usable_cores
from nightlab.fleet.health import (
    SAMPLE_SECONDS,
    CpuSampler,
    GpuWatcher,
    Health,
    MarkCache,
    scan_runs,
)


def pick_gpu(indices: list[int], lane: str | None, visible: str | None) -> int | None:
    """The GPU index (as `nvidia-smi` numbers it) that a run on this lane used, if one can be told.

    The lane's own index (`NIGHTLAB_GPU`) when the node shows it; else the first of
    `CUDA_VISIBLE_DEVICES` when numeric and shown (Slurm sets it to the step's GPU); else the one
    GPU a step confined to its device sees. None when nothing says which (judged by CPU).
    """
    for text in (lane, visible):
        first = (text or "").split(",")[0].strip()
        if first.isdigit() and int(first) in indices:
            return int(first)
    return indices[0] if len(indices) == 1 else None


class WorkerSampler:
    """One run's CPU threads (by mark) and the node's GPUs, until `stop`; `report` is the result."""

    def __init__(self, *, mark: str, threads: int, exclude: set[int], gpus: GpuWatcher | None = None) -> None:
        self.mark = mark
        self.exclude = exclude | {os.getpid()}
        self.started_at = time.time()
        self.cpu = CpuSampler(root=None, mark=mark, threads=threads, started_at=self.started_at)
        self.gpus = gpus or GpuWatcher()
        self._marks = MarkCache()
        self._stop = threading.Event()

    def sample(self) -> None:
        found = scan_runs({0: (None, self.mark)}, self._marks)[0]
        self.cpu.add({key: value for key, value in found.items() if key[0] not in self.exclude})

    def run(self, interval: float = SAMPLE_SECONDS) -> None:
        """Sample until `stop` (a signal handler calls it), then once more: the run has just ended."""
        self.gpus.start()
        self.sample()
        while not self._stop.wait(interval):
            self.sample()
        self.sample()
        self.gpus.stop()

    def stop(self) -> None:
        self._stop.set()

    def report(self, *, lane: str | None, visible: str | None) -> Health:
        """The run's health, not judged: the controller applies its thresholds."""
        ended = time.time()
        health = self.cpu.health(ended_at=ended)
        if not self.gpus.available:
            return health
        gpu = pick_gpu(self.gpus.indices(), lane, visible)
        if gpu is None:
            return health
        return health.with_gpu(self.gpus.samples(gpu, self.started_at, ended), gpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nightlab.fleet.worker_health")
    parser.add_argument("--mark", required=True, help="the run's NIGHTLAB_ATTEMPT value")
    parser.add_argument(
        "--threads", type=int, default=0, help="the lane's CPU threads (0: this node's cores)"
    )
    parser.add_argument("--exclude", type=int, nargs="*", default=[], help="pids of the run script itself")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    # its own children (nvidia-smi) must not count as the run's
    os.environ.pop(procs.MARK, None)
    sampler = WorkerSampler(mark=args.mark, threads=args.threads or usable_cores(), exclude=set(args.exclude))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sampler.stop())
    procs.signal_on_parent_death(signal.SIGTERM)  # a cancelled job's run script: report and go
    sampler.run()
    report = sampler.report(
        lane=os.environ.get("NIGHTLAB_GPU"), visible=os.environ.get("CUDA_VISIBLE_DEVICES")
    )
    atomic_write_json(args.out, report.measurements())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
