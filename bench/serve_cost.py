"""What serving a batch from the supervisor costs the training process (issue 30), per batch.

The batch server runs in another process (forked, as the supervisor is another process), packing
real rows from a prepared demo cache (the same packer as the old in-process loader) behind a
clock with a budget no run reaches; the client is `clock.TrainingClock`, as in train.py. For each
shape it times `next()` on the client (request, wait, receive, int64 tensors) and, for comparison,
`next()` on the old in-process loader (`loader.train_batches`, packing on a thread four batches
ahead), the consumer sleeping `--step-ms` between batches as a step's compute would (the server
packs the next batch then; an H100 step of the h100 profile is ~160 ms a batch). Shapes: the cpu profile's batch (8 x 257) and h100's (128 x 2049) on the CPU
device; the GPU copy is not in it (no GPU here: the arithmetic is in bench/RESULTS.md).

Usage: .venv/bin/python bench/serve_cost.py [--batches 300] [--step-ms 50]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import tempfile
import time
from pathlib import Path

from nightlab.harness import serve
from nightlab.harness.clock import TrainingClock
from nightlab.harness.data import prepare
from nightlab.harness.loader import train_batches
from nightlab.harness.profiles import get_profile


def served_cost(data: Path, batch: int, seq_len: int, n: int, step: float) -> list[float]:
    mine, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the "supervisor": serve until the client closes
        mine.close()
        server = serve.BatchServer(theirs, serve.ServerConfig(data, seq_len, budget=1e9, max_steps=0))
        server.serve()
        os._exit(0)
    theirs.close()
    try:
        clock = TrainingClock(mine, device="cpu", batch_size=batch, seed=0)
        for _ in range(12):  # past the warm-up (2 steps), and the packer's first buffer fill
            next(clock)
            clock.step()
        times = []
        for _ in range(n):
            time.sleep(step)  # the step's compute, in which the server packs the next batch
            t = time.perf_counter()
            next(clock)
            times.append(time.perf_counter() - t)
        return times
    finally:
        mine.close()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def loader_cost(data: Path, batch: int, seq_len: int, n: int, step: float) -> list[float]:
    batches = train_batches(data, batch, seq_len, "cpu", seed=0)
    for _ in range(12):
        next(batches)
    times = []
    for _ in range(n):
        time.sleep(step)  # the step's compute, in which the prefetch thread refills
        t = time.perf_counter()
        next(batches)
        times.append(time.perf_counter() - t)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=300, help="batches timed per shape and way")
    parser.add_argument("--step-ms", type=float, default=50.0, help="the consumer's compute between batches")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="serve-cost-") as tmp:
        profile = get_profile("cpu")
        os.environ["NIGHTLAB_DATA_DIR"] = tmp
        data = Path(tmp) / "cpu"
        prepare(profile, data_dir=data, progress=False)
        for name, batch, seq_len in (("cpu", 8, 256), ("h100", 128, 2048)):
            wire = batch * (seq_len + 1) * 2
            s = served_cost(data, batch, seq_len, args.batches, args.step_ms / 1e3)
            old = loader_cost(data, batch, seq_len, args.batches, args.step_ms / 1e3)
            print(
                f"{name:5} batch {batch} x {seq_len + 1} ({wire / 1024:.0f} KiB on the wire): served next() median "
                f"{statistics.median(s) * 1e3:.2f} ms, p90 {statistics.quantiles(s, n=10)[-1] * 1e3:.2f} ms | "
                f"in-process loader next() median {statistics.median(old) * 1e3:.2f} ms, "
                f"p90 {statistics.quantiles(old, n=10)[-1] * 1e3:.2f} ms | load {os.getloadavg()[0]:.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
