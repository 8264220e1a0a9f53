"""The batch server and its clock (harness/serve.py), with the client train.py uses (harness/clock.py).

A real socket pair and a real server thread; the server's clock is a fake time the test moves, so
the warm-up rule, the budget stop, the second clock and the hand-in are checked exactly, without
timed assertions. Run: .venv/bin/python -m pytest -q tests/harness/test_serve.py
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import numpy as np
import pytest

from nightlab.errors import NightlabError
from nightlab.harness import serve
from nightlab.harness.clock import TrainingClock
from nightlab.harness.data import prepare
from nightlab.harness.loader import train_batches
from nightlab.harness.profiles import Profile, fingerprint

torch = pytest.importorskip("torch")

T = 16


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class CountingRows:
    """Rows whose first token numbers them: row k starts with k (so repeats are visible)."""

    def __init__(self, seq_len: int) -> None:
        self.row_len = seq_len + 1
        self.dtype = np.dtype("<u2")
        self.taken = 0

    def take(self, n: int) -> np.ndarray:
        rows = np.zeros((n, self.row_len), dtype=self.dtype)
        rows[:, 0] = np.arange(self.taken, self.taken + n)
        rows[:, 1:] = 7
        self.taken += n
        return rows


@pytest.fixture
def served():
    """Factory: `served(budget=..., max_steps=...)` -> (server, client socket, fake time); stops them after."""
    made: list[tuple[socket.socket, socket.socket, threading.Thread]] = []

    def make(
        *, budget: float = 10.0, max_steps: int = 0, on_handin=None, rows=None, data_dir: Path = Path(".")
    ):
        fake = FakeTime()
        mine, theirs = socket.socketpair()
        server = serve.BatchServer(
            mine,
            serve.ServerConfig(data_dir, T, budget, max_steps),
            on_handin=on_handin,
            rows=rows or (lambda seed: CountingRows(T)),
            now=fake,
        )
        thread = threading.Thread(target=server.serve, daemon=True)
        thread.start()
        made.append((mine, theirs, thread))
        return server, theirs, fake

    yield make
    for mine, theirs, thread in made:
        theirs.close()
        thread.join(timeout=5)
        mine.close()


def first_tokens(x) -> list[int]:
    return x[:, 0].tolist()


def test_warm_up_batches_repeat_one_batch_then_fresh_batches_until_the_budget(served):
    server, sock, fake = served(budget=10.0)
    clock = TrainingClock(sock, device="cpu", batch_size=2, seed=0)
    assert clock.budget == 10.0 and clock.seq_len == T
    warm = []
    for _ in range(2):  # two warm-up steps (cpu), each on the same batch
        x, y = next(clock)
        warm.append(first_tokens(x))
        assert x.dtype == torch.int64 and x.shape == (2, T) and torch.equal(x[:, 1:], y[:, :-1])
        fake.now += 1.0
        clock.step()
    assert warm == [[0, 1], [0, 1]]
    assert clock.progress == 0.0
    fresh = []
    for x, _ in clock:  # timed from the end of warm-up: 1 s a batch, 10 s budget
        fresh.append(first_tokens(x))
        fake.now += 1.0
        clock.step()
    assert fresh[0] == [2, 3]  # the stream goes on after the warm-up batch (packed ahead) ...
    assert len(fresh) == 10 and len({tuple(f) for f in fresh}) == 10  # ... every timed batch is fresh
    figures = clock.figures()
    assert figures.warmup_seconds == 2.0 and figures.warmup_steps == 2 and figures.warmup_batches == 2
    assert figures.training_seconds == 10.0 and figures.exhausted and figures.batches == 10


def test_a_warm_up_without_steps_ends_at_the_cap_and_never_trains(served):
    server, sock, fake = served(budget=10.0)
    clock = TrainingClock(sock, device="cpu", batch_size=1, seed=0)
    seen = []
    for x, _ in clock:  # never calls step(): 1 s a batch; warm-up capped at 25 % of the budget
        seen.append(first_tokens(x)[0])
        fake.now += 1.0
    figures = clock.figures()
    assert figures.warmup_seconds == 2.5 and figures.warmup_batches == 3
    assert seen[:3] == [0, 0, 0] and len(set(seen[3:])) == len(seen) - 3  # then fresh, never repeated
    assert 10.0 <= figures.training_seconds < 11.0 and figures.batches == 10

    # a first step far longer than the cap: the time past the cap is timed
    server, sock, fake = served(budget=10.0)
    clock = TrainingClock(sock, device="cpu", batch_size=1, seed=0)
    next(clock)
    fake.now += 30.0
    clock.step()
    with pytest.raises(StopIteration):  # 27.5 s timed already: the budget is spent
        next(clock)
    assert clock.figures().warmup_seconds == 2.5
    assert clock.figures().warmup_steps == 0  # the step across the cap is a timed one


def test_a_second_clock_is_the_same_stream_under_the_same_budget(served):
    server, sock, fake = served(budget=4.0)
    first = TrainingClock(sock, device="cpu", batch_size=1, seed=0)
    seen = []
    for x, _ in first:
        seen.append(first_tokens(x)[0])
        fake.now += 1.0
        first.step()
    second = TrainingClock(sock, device="cpu", batch_size=1, seed=99)
    assert list(second) == []  # spent is spent
    assert server.seed == 0  # the first clock's seed orders the stream
    assert first.figures().exhausted and first.figures().steps == len(seen)


def test_a_second_clock_before_the_end_continues_the_stream(served):
    server, sock, fake = served(budget=100.0)
    a = TrainingClock(sock, device="cpu", batch_size=2, seed=0)
    for _ in range(3):
        next(a)
        a.step()
    b = TrainingClock(sock, device="cpu", batch_size=2, seed=0)
    rows_b = first_tokens(next(b)[0])
    rows_a = first_tokens(next(a)[0])
    assert rows_b != rows_a and min(rows_b + rows_a) >= 2  # no batch served twice, no restart at row 0


def test_max_steps_stop_and_progress(served):
    server, sock, fake = served(budget=10.0, max_steps=4)
    clock = TrainingClock(sock, device="cpu", batch_size=1, seed=0)
    n = 0
    for _ in clock:
        clock.step()
        n += 1
    assert n == 4 and clock.progress == 1.0 and clock.figures().exhausted


def test_the_hand_in_is_taken_once_and_ends_serving(served):
    calls = []
    server, sock, fake = served(budget=10.0, on_handin=lambda: calls.append(fake.now))
    clock = TrainingClock(sock, device="cpu", batch_size=1, seed=0)
    next(clock)
    fake.now += 3.0
    figures = clock.hand_in()
    assert calls == [103.0] and figures["handed_in_at"] - figures["last_served_at"] == 3.0
    fake.now += 5.0
    clock.hand_in()  # a second hand-in changes nothing
    assert calls == [103.0] and server.figures()["handed_in_at"] == figures["handed_in_at"]
    with pytest.raises(StopIteration):
        next(clock)


def test_a_broken_request_is_recorded_and_missing_data_names_prepare(served, tmp_path):
    server, sock, fake = served()
    sock.sendall(serve.REQUEST.pack(99, 0, 0, 0))
    for _ in range(100):
        if server.error:
            break
        threading.Event().wait(0.05)
    assert server.error == "unknown request 99"  # the supervisor makes the run invalid with it

    missing = tmp_path / "never-prepared"
    server, sock, fake = served(rows=lambda seed: serve.PackedRows(missing, T, seed), data_dir=missing)
    with pytest.raises(NightlabError, match="prepare"):
        TrainingClock(sock, device="cpu", batch_size=1, seed=0)


def test_served_rows_are_the_loaders_rows_in_uint16(tmp_path):
    """The stream is the old in-process loader's, packed the same way; 2 bytes a token on the wire."""
    profile = Profile("serve", "demo", vocab_size=512, seq_len=T, budget_seconds=2.0, eval_tokens=256)
    data = tmp_path / fingerprint(profile)
    prepare(profile, data_dir=data, progress=False)
    rows = serve.PackedRows(data, T, seed=3)
    assert rows.dtype == np.dtype("<u2")
    served_rows = rows.take(8).astype(np.int64)
    x, y = next(train_batches(data, 8, T, "cpu", seed=3))
    assert np.array_equal(served_rows[:, :-1], x.numpy()) and np.array_equal(served_rows[:, 1:], y.numpy())


def test_grace_and_wall_allowance_per_profile(monkeypatch):
    from nightlab.harness.attempt import wall_allowance

    monkeypatch.delenv(serve.GRACE_ENV, raising=False)
    monkeypatch.delenv("NIGHTLAB_WALL_ALLOWANCE", raising=False)
    assert serve.grace_seconds(30.0) == 10.5 and serve.grace_seconds(300.0) == 15.0
    assert wall_allowance(30.0) == 45.0 + 7.5 + 10.5  # cpu: was 75 s
    assert wall_allowance(300.0) == 45.0 + 60.0 + 15.0  # h100: was 210 s
