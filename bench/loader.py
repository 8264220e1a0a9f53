"""Benchmark: best-fit packing and the training data pipeline.

1. Packing: `BestFitPacker` against `pack_reference` (the plain rule, a linear buffer scan
   per placement) on the same documents, buffer 1000, rows of 2049 tokens, for web-length
   documents (median ~250 tokens) and short ones (median ~90). Checks the rows are identical.
   Goal: >= 2x faster on web-length documents, >= 5x on short ones.
2. Pipeline: token cache -> packed (x, y) int64 batches through `train_batches` (memory-mapped
   cache, background thread), on the cpu profile's demo data. Goal: >= 10 M tokens/s. Then
   the same with a consumer that "trains" for a few ms a step: the time it spends waiting
   for data shows whether batches are ready ahead of it.

Run: `.venv/bin/python bench/loader.py` (about half a minute on a 2-core CPU).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from nightlab.harness.data import prepare
from nightlab.harness.loader import BestFitPacker, pack_reference, train_batches
from nightlab.harness.profiles import get_profile

ROW_LEN = 2049
BUFFER = 1000


def documents(median: int, n: int, seed: int = 0) -> list[np.ndarray]:
    """Lognormal document lengths (sigma 1, like web text), BOS-led, as views of one uint16 array."""
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, rng.lognormal(np.log(median), 1.0, size=n).astype(np.int64))
    tokens = rng.integers(0, 8192, size=int(lengths.sum()), dtype=np.uint16)
    ends = np.cumsum(lengths)
    tokens[ends - lengths] = 8187  # BOS at every document start
    return [tokens[e - k : e] for e, k in zip(ends.tolist(), lengths.tolist(), strict=True)]


def bench_packing(name: str, median: int, n_rows: int) -> None:
    docs = documents(median, n_docs := n_rows * ROW_LEN // median + 20 * BUFFER)
    t = time.perf_counter()
    ref = pack_reference(docs, ROW_LEN, n_rows, BUFFER)
    t_ref = time.perf_counter() - t
    t = time.perf_counter()
    packer = BestFitPacker(docs, ROW_LEN, BUFFER)
    fast = np.concatenate([packer.next_batch(32) for _ in range(n_rows // 32)])
    t_fast = time.perf_counter() - t
    same = np.array_equal(fast, ref)
    tokens = n_rows * ROW_LEN
    print(
        f"{name:<18} {np.median([len(d) for d in docs]):>6.0f} {n_docs:>8} {tokens / t_ref / 1e6:>10.2f} "
        f"{tokens / t_fast / 1e6:>10.2f} {t_ref / t_fast:>8.1f}x  {'identical' if same else 'DIFFERENT'}"
    )
    assert same, "BestFitPacker differs from the reference"


def bench_pipeline(data: Path, batch: int, seq: int, seconds: float = 3.0, work_ms: float = 0.0) -> None:
    it = train_batches(data, batch, seq, "cpu", seed=1)
    next(it)  # start-up: memory-mapping and the first batch
    n = steps = 0
    waited = 0.0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        x, _ = next(it)
        waited += time.perf_counter() - t
        n += x.numel()
        steps += 1
        if work_ms:
            time.sleep(work_ms / 1000)  # stands in for a training step (releases the GIL like torch does)
    elapsed = time.perf_counter() - start
    it.close()
    label = f"B={batch} T={seq}" + (f", {work_ms:g} ms/step of work" if work_ms else "")
    waiting = f"  waiting for data {100 * waited / elapsed:4.1f}% of the time" if work_ms else ""
    print(f"{label:<32} {n / elapsed / 1e6:>8.2f} M tok/s  {steps / elapsed:>8.0f} batches/s{waiting}")


def main() -> None:
    print(f"# packing: buffer {BUFFER}, rows of {ROW_LEN}; throughput in M tokens/s")
    print(f"{'documents':<18} {'median':>6} {'docs':>8} {'reference':>10} {'packer':>10} {'speedup':>9}")
    bench_packing("web-length", 250, 3200)
    bench_packing("short", 90, 3200)

    print(
        "\n# pipeline: token cache -> packed int64 (x, y) batches on a background thread (cpu profile data)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        data = prepare(get_profile("cpu"), data_dir=Path(tmp) / "cpu", progress=False, workers=2)
        bench_pipeline(data, 8, 256)
        bench_pipeline(data, 32, 256)
        bench_pipeline(data, 64, 2048)
        bench_pipeline(data, 8, 256, work_ms=2.0)
        bench_pipeline(data, 64, 2048, work_ms=20.0)


if __name__ == "__main__":
    main()
