"""Health-sampling overhead: what watching runs' machine health costs the controller.

The controller takes one health sample per heartbeat (1 s): one pass over /proc that finds
every process of every running run (its wrapper's tree and session, and every process with
the run's NIGHTLAB_ATTEMPT mark, each environment read once) and reads the schedstat of each
of their threads (fleet/health.py). This starts N process groups of T sleeping threads each,
marked like runs (stand-ins for running experiments), times `HealthWatch.sample` over many
passes, and reports the CPU time per sample and per run of a given length.

Usage: .venv/bin/python bench/health_overhead.py [--runs 1,4,16] [--threads 8] [--samples 200] [--run-seconds 300]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from nightlab.config import FleetConfig
from nightlab.fleet.backend import WorkerSlot
from nightlab.fleet.health import HealthWatch
from nightlab.procs import MARK

SLEEPER = "import threading, time\n[threading.Thread(target=time.sleep, args=(600,)).start() for _ in range({t} - 1)]\ntime.sleep(600)\n"


class _Attempt:
    def __init__(self, i: int) -> None:
        self.id, self.experiment_id, self.started_at = i, f"e{i:04d}", time.time()


def measure(runs: int, threads: int, samples: int) -> float:
    """CPU seconds of one `sample()` with `runs` groups of `threads` threads watched."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SLEEPER.format(t=threads)],
            start_new_session=True,
            env={**os.environ, MARK: f"/bench/attempt-{i}"},
        )
        for i in range(runs)
    ]
    try:
        time.sleep(1.0)  # let the threads start
        slots = [WorkerSlot(f"cpu-{i}", "cpu", "local", info={"threads": threads}) for i in range(runs)]
        watch = HealthWatch(FleetConfig(pools=(), default_tier="cpu"), slots)
        for i, (slot, proc) in enumerate(zip(slots, procs, strict=True)):
            watch.watch(_Attempt(i), slot, {"pgid": proc.pid, "mark": f"/bench/attempt-{i}"})
        start = time.process_time()
        for _ in range(samples):
            watch.sample()
        per_sample = (time.process_time() - start) / samples
        health = watch.finish(_Attempt(0))
        assert health is not None and health.samples == samples
        return per_sample
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="1,4,16")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--run-seconds", type=float, default=300.0)
    args = parser.parse_args()
    processes = len(os.listdir("/proc"))
    print(f"/proc holds ~{processes} entries; {args.threads} threads per run; 1 sample per second")
    for runs in (int(x) for x in args.runs.split(",")):
        per = measure(runs, args.threads, args.samples)
        per_run = per * args.run_seconds / runs  # one pass serves every running run
        print(
            f"{runs:3d} runs watched: {per * 1e3:6.2f} ms CPU per sample, "
            f"{per_run:5.2f} s CPU per {args.run_seconds:.0f} s run ({per_run / args.run_seconds:.2%} of one core)"
        )


if __name__ == "__main__":
    main()
