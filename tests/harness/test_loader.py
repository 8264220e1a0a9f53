"""Loader: best-fit packing against the plain rule, and the cache-backed batch iterators.

Run: `pytest tests/harness/test_loader.py`. The CUDA test (pinned memory, non-blocking
copy) is skipped without a GPU.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from labkit import wait_until
from nightlab.harness.cache import DataError, DataNotPreparedError, load_manifest, open_split
from nightlab.harness.loader import BestFitPacker, pack_reference, train_batches, val_batches

BOS = 1019  # the cpu profile's BOS id: 1024 - 5 special tokens


def random_docs(seed: int, n: int, median: float, *, as_arrays: bool = True) -> list:
    rng = np.random.default_rng(seed)
    lengths = np.maximum(0, rng.lognormal(np.log(median), 1.0, size=n).astype(int))
    docs = [rng.integers(0, 50, size=k) for k in lengths]
    return docs if as_arrays else [d.tolist() for d in docs]


def test_hand_worked_rule():
    # row of 6: buffer [A4, B2, C2, D5]; largest fit = D5 (5 <= 6); then 1 left: nothing fits,
    # crop the shortest, earliest on ties: B. Next row: A4 fits, then C2 (the earliest 2 left).
    docs = [[1] * 4, [2] * 2, [3] * 2, [4] * 5]
    rows = BestFitPacker(docs, row_len=6, buffer_size=10).next_batch(2).tolist()
    assert rows == [[4, 4, 4, 4, 4, 2], [1, 1, 1, 1, 3, 3]]


def test_largest_fit_ties_go_to_the_earliest():
    docs = [[7, 1], [8, 1], [9, 9, 9]]
    assert BestFitPacker(docs, 4, buffer_size=3).next_batch(1).tolist() == [[9, 9, 9, 7]]


def test_buffer_size_is_the_look_ahead():
    docs = [[1, 1], [2, 2, 2], [3]]
    one = BestFitPacker(docs, 4, buffer_size=1)  # no look-ahead: place A, then crop B
    assert one.next_batch(1).tolist() == [[1, 1, 2, 2]]
    three = BestFitPacker(docs, 4, buffer_size=3)  # sees all three: B then C fill the row exactly
    assert three.next_batch(1).tolist() == [[2, 2, 2, 3]]
    with pytest.raises(EOFError):
        one.next_batch(1)


@pytest.mark.parametrize(
    ("median", "row_len", "buffer_size"),
    [(250, 2049, 1000), (90, 2049, 1000), (40, 65, 7), (300, 129, 50), (5, 17, 1), (2000, 513, 100)],
)
def test_identical_to_reference(median, row_len, buffer_size):
    docs = random_docs(median + row_len, 3000, median)
    n_rows = 40
    fast = np.concatenate([BestFitPacker(docs, row_len, buffer_size).next_batch(n_rows)])
    ref = pack_reference(docs, row_len, n_rows, buffer_size)
    assert fast.shape == ref.shape == (n_rows, row_len)
    np.testing.assert_array_equal(fast, ref)


def test_identical_to_reference_across_batches_and_lists():
    docs = random_docs(3, 2000, 60, as_arrays=False)
    packer = BestFitPacker(iter(docs), 257, 100)
    fast = np.concatenate([packer.next_batch(b) for b in (1, 5, 3, 11)])
    np.testing.assert_array_equal(fast, pack_reference(docs, 257, 20, 100))


def test_runs_out_like_the_reference():
    docs = random_docs(4, 200, 30)
    ref = pack_reference(docs, 65, 10_000, 20)
    packer = BestFitPacker(docs, 65, 20)
    rows = []
    with pytest.raises(EOFError):
        while True:
            rows.append(packer.next_batch(1))
    np.testing.assert_array_equal(np.concatenate(rows), ref)
    assert 0 < len(ref) < 10_000


def test_bad_arguments():
    with pytest.raises(ValueError, match="row_len"):
        BestFitPacker([], 0)


# ---------------------------------------------------------------------------
# Batches from the token cache (the cpu profile's demo data)


def test_train_batches_shape_shift_and_bos(cpu_data: Path):
    it = train_batches(cpu_data, 4, 256, "cpu")
    for _ in range(3):
        x, y = next(it)
        assert x.shape == y.shape == (4, 256) and x.dtype == y.dtype == torch.int64
        assert x.is_contiguous() and y.is_contiguous()
        assert bool((x[:, 0] == BOS).all())
        assert torch.equal(x[:, 1:], y[:, :-1])
    it.close()


def test_train_batches_seed_zero_is_stored_order(cpu_data: Path):
    split = open_split(cpu_data, "train")
    docs = (split.doc(i) for i in range(split.n_docs))
    expected = pack_reference(docs, 257, 6, 1000)
    x, y = next(train_batches(cpu_data, 6, 256, "cpu", seed=0))
    np.testing.assert_array_equal(x.numpy(), expected[:, :-1])
    np.testing.assert_array_equal(y.numpy(), expected[:, 1:])


def test_train_batches_seeds(cpu_data: Path):
    a = next(train_batches(cpu_data, 4, 256, "cpu", seed=1))[0]
    b = next(train_batches(cpu_data, 4, 256, "cpu", seed=1))[0]
    c = next(train_batches(cpu_data, 4, 256, "cpu", seed=2))[0]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_train_batches_run_past_an_epoch(cpu_data: Path):
    tokens = load_manifest(cpu_data)["splits"]["train"]["tokens"]
    it = train_batches(cpu_data, 64, 256, "cpu", seed=3)
    for _ in range(tokens // (64 * 256) + 3):  # more batches than one epoch holds
        x, y = next(it)
        assert x.shape == y.shape == (64, 256)
        assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one


def test_val_batches_independent_of_batch_size(cpu_data: Path):
    n_tokens = 5000
    rows = math.ceil(n_tokens / 256)
    by3 = list(val_batches(cpu_data, 3, 256, "cpu", n_tokens))
    by8 = list(val_batches(cpu_data, 8, 256, "cpu", n_tokens))
    assert [x.shape[0] for x, _ in by8] == [8] * (rows // 8) + ([rows % 8] if rows % 8 else [])
    for i in (0, 1):
        assert torch.equal(torch.cat([b[i] for b in by3]), torch.cat([b[i] for b in by8]))
    assert torch.equal(
        torch.cat([b[0] for b in by3]),
        torch.cat([b[0] for b in val_batches(cpu_data, 3, 256, "cpu", n_tokens)]),
    )


def test_val_batches_too_small(cpu_data: Path):
    val_tokens = load_manifest(cpu_data)["splits"]["val"]["tokens"]
    with pytest.raises(DataError, match="validation split .* fewer than"):
        next(val_batches(cpu_data, 16, 256, "cpu", val_tokens + 1))  # cannot fit: fails before any batch
    # enough tokens in total, but the cropped remainders are lost: fails when packing runs dry
    rows_if_nothing_lost = val_tokens // 257
    with pytest.raises(DataError, match="validation split .* fewer than"):
        list(val_batches(cpu_data, 16, 256, "cpu", rows_if_nothing_lost * 256))


def test_not_prepared(tmp_path: Path):
    with pytest.raises(DataNotPreparedError, match="nightlab prepare"):
        next(train_batches(tmp_path, 4, 256, "cpu"))
    with pytest.raises(DataNotPreparedError, match="nightlab prepare"):
        next(val_batches(tmp_path, 4, 256, "cpu", 1000))


def test_prefetch_thread_stops_with_the_iterator(cpu_data: Path):
    # this iterator's own thread: an earlier test's loader may still be winding down meanwhile
    # (a count of them once saw that one end too: 1 before, 0 after)
    def loaders() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == "nightlab-loader"}

    before = loaders()
    it = train_batches(cpu_data, 4, 256, "cpu")
    next(it)
    (mine,) = loaders() - before
    it.close()
    wait_until(lambda: not mine.is_alive(), timeout=5, interval=0.01, what="the loader thread's end")


def test_producer_errors_reach_the_consumer(cpu_data: Path, monkeypatch: pytest.MonkeyPatch):
    def broken(self, B, **kw):
        raise DataError("disk on fire")

    monkeypatch.setattr(BestFitPacker, "next_batch", broken)
    with pytest.raises(DataError, match="disk on fire"):
        next(train_batches(cpu_data, 4, 256, "cpu"))


@pytest.mark.gpu  # skipped without a CUDA GPU, said before the first test (tests/needs.py)
def test_cuda_batches_match_cpu(cpu_data: Path):
    gpu = train_batches(cpu_data, 8, 256, "cuda", seed=5)
    cpu = train_batches(cpu_data, 8, 256, "cpu", seed=5)
    for _ in range(20):  # more batches than pinned buffers: exercises their reuse
        (gx, gy), (cx, cy) = next(gpu), next(cpu)
        assert gx.is_cuda and torch.equal(gx.cpu(), cx) and torch.equal(gy.cpu(), cy)
