"""The training clock, as train.py sees it: batches served by the harness until the budget is spent.

DO NOT CHANGE without a new epoch (`serve.CLOCK_VERSION`): every result's training time is measured
by the rule this client follows.

`training_batches(profile, batch_size, device, seed=...)` returns a `TrainingClock`: an iterator
whose every `next()` asks the harness's batch server (`serve.py`) for one batch. Inside the fleet
that server runs in the supervisor, outside the sandbox, which alone reads the training data and
keeps the clock: it decides when the untimed warm-up ends (every warm-up batch is the same batch),
when the budget is spent (the loop's `for` ends), and it refuses a hand-in that comes later than a
short grace after the last batch it served. Nothing in this process can buy time: a slowed or
patched clock here changes only what this process believes; a second `training_batches(...)`
continues the same stream under the same budget. Run by hand, the same server runs on a thread of
this process (`serve.local_connection`).

`clock.step()` marks an optimizer step (warm-up ends after `warmup_steps(device)` of them: 10 on
CUDA, 2 elsewhere, or at the seconds cap); `clock.progress` (0..1) drives a schedule; `figures()`
are the server's measurements (the run's harness-owned timing keys).

Usage:
    batches = training_batches(profile, DEVICE_BATCH_SIZE, device, seed=seed)
    for x, y in batches: ...; batches.step()  # after each optimizer step
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nightlab.errors import NightlabError
from nightlab.harness import serve
from nightlab.harness.serve import WARMUP_FRACTION_CAP, WARMUP_SECONDS_CAP, warmup_steps

if TYPE_CHECKING:
    import torch

    from nightlab.harness.profiles import Profile

__all__ = [
    "WARMUP_FRACTION_CAP",
    "WARMUP_SECONDS_CAP",
    "ClockFigures",
    "TrainingClock",
    "training_batches",
    "warmup_steps",
]


@dataclass(frozen=True)
class ClockFigures:
    """What the harness's clock measured: the harness-owned timing keys of a run."""

    training_seconds: float  # timed training: from the end of warm-up to the last batch served
    warmup_seconds: float  # untimed: from the first batch to the end of warm-up
    warmup_steps: int  # optimizer steps inside the warm-up
    steps: int  # optimizer steps marked with `step()`
    batches: int  # fresh batches served (after the warm-up)
    budget_seconds: float
    exhausted: bool  # the clock stopped serving because the budget was spent
    warmup_batches: int = 0  # batches served during the warm-up: all one batch

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class ServerGoneError(NightlabError):
    """The harness's batch server stopped answering."""


class TrainingClock:
    """Batches from the harness's server until it says the budget is spent (see the module docstring).

    Each batch is (x, y): int64 [B, T] on `device`, y shifted by one token, every row starting with
    BOS. Rows arrive as raw token ids into one preallocated host buffer (pinned on CUDA, copied with a
    non-blocking copy and widened to int64 on the device).
    """

    def __init__(self, sock: socket.socket, *, device: str, batch_size: int, seed: int = 0) -> None:
        self._sock = sock
        self.device = str(device)
        self.batch_size = int(batch_size)
        self.seed = seed
        self._cuda = self.device.startswith("cuda")
        self._steps = 0  # steps marked on this object
        self._unsent = 0  # steps not yet reported to the server
        self._timed = -1.0  # the server's timed seconds at the last reply
        self._timed_at = 0.0
        flags = serve.FLAG_CUDA if self._cuda else 0
        reply = self._ask(serve.REQUEST.pack(serve.OP_HELLO, flags, self.batch_size, seed), serve.HELLO.size)
        status, row_len, itemsize, self.max_steps, self._budget = serve.HELLO.unpack(reply)
        if status == serve.STATUS_ERROR:
            raise NightlabError(self._recv_json_text())
        self.seq_len = row_len - 1
        dtype = np.dtype("<u2") if itemsize == 2 else np.dtype("<i4")
        if self._cuda:
            import torch

            pinned = torch.empty(self.batch_size * row_len * itemsize, dtype=torch.uint8).pin_memory()
            self._host = pinned
            self._rows = pinned.numpy().view(dtype).reshape(self.batch_size, row_len)
        else:
            self._host = None
            self._rows = np.empty((self.batch_size, row_len), dtype=dtype)
        self._header = bytearray(serve.BATCH.size)

    # -- socket helpers

    def _recv_into(self, view: memoryview) -> None:
        got = 0
        while got < len(view):
            k = self._sock.recv_into(view[got:], len(view) - got)
            if k == 0:
                raise ServerGoneError("the harness's batch server went away (the supervisor ended?)")
            got += k

    def _ask(self, request: bytes, reply_size: int) -> bytes:
        self._sock.sendall(request)
        buf = bytearray(reply_size)
        self._recv_into(memoryview(buf))
        return bytes(buf)

    def _recv_json_text(self) -> str:
        (n,) = serve.LENGTH.unpack(self._recv_exact(serve.LENGTH.size))
        return self._recv_exact(n).decode("utf-8", "replace")

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray(n)
        self._recv_into(memoryview(buf))
        return bytes(buf)

    def _report(self) -> int:
        steps, self._unsent = self._unsent, 0
        return steps

    # -- the iterator

    @property
    def budget(self) -> float:
        """The training budget in seconds (the lab profile's; `NIGHTLAB_BUDGET` by hand, in tests)."""
        return self._budget

    def __iter__(self) -> TrainingClock:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        if self._cuda:  # time finished work, not queued kernels; and the pinned buffer is free again
            torch.cuda.synchronize()
        self._sock.sendall(serve.REQUEST.pack(serve.OP_NEXT, 0, self._report(), 0))
        self._recv_into(memoryview(self._header))
        status, rows, timed = serve.BATCH.unpack(self._header)
        self._timed, self._timed_at = timed, time.perf_counter()
        if status != serve.STATUS_BATCH:
            raise StopIteration
        if rows != self.batch_size:
            raise ServerGoneError(f"the batch server sent {rows} rows, not {self.batch_size}")
        self._recv_into(memoryview(self._rows).cast("B"))
        T = self.seq_len
        if self._cuda:
            on_device = self._host.to(self.device, non_blocking=True)
            if self._rows.dtype.itemsize == 2:  # uint16 ids: int16 is the view every kernel supports
                ids = on_device.view(torch.int16).long() & 0xFFFF
            else:
                ids = on_device.view(torch.int32).long()
            ids = ids.view(self.batch_size, T + 1)
            return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
        pair = torch.empty((2, self.batch_size, T), dtype=torch.int64)
        out = pair.numpy()
        out[0] = self._rows[:, :-1]
        out[1] = self._rows[:, 1:]
        return pair[0], pair[1]

    def step(self) -> None:
        """Mark the end of one optimizer step (reported to the server with the next request)."""
        self._steps += 1
        self._unsent += 1

    @property
    def progress(self) -> float:
        """Fraction of the budget used, 0..1 (of max_steps when that is set), as the server last said."""
        if self.max_steps:
            return min(self._steps / self.max_steps, 1.0)
        if self._timed < 0:
            return 0.0
        return min((self._timed + time.perf_counter() - self._timed_at) / self._budget, 1.0)

    @property
    def steps(self) -> int:
        return self._steps

    def figures(self) -> ClockFigures:
        """The server's measurements so far."""
        self._sock.sendall(serve.REQUEST.pack(serve.OP_FIGURES, 0, self._report(), 0))
        return _figures(json.loads(self._recv_json_text()))

    def hand_in(self) -> dict[str, Any]:
        """Tell the server the model is handed in (`handoff.hand_in` calls this); its figures."""
        self._sock.sendall(serve.REQUEST.pack(serve.OP_HANDIN, 0, self._report(), 0))
        return json.loads(self._recv_json_text())


def _figures(raw: dict[str, Any]) -> ClockFigures:
    names = {f.name for f in fields(ClockFigures)}
    return ClockFigures(**{k: v for k, v in raw.items() if k in names})


_SUPERVISED: socket.socket | None = None


def _connection(profile: Profile, data_dir: Path | None) -> socket.socket:
    """The supervisor's socket (`NIGHTLAB_BATCH_FD`), else a server on a thread of this process."""
    global _SUPERVISED
    fd = os.environ.get(serve.FD_ENV)
    if fd:
        if _SUPERVISED is None:  # one socket object per descriptor: every clock shares it
            _SUPERVISED = socket.socket(fileno=int(fd))
        return _SUPERVISED
    from nightlab.harness.profiles import data_dir as default_data_dir

    budget = float(os.environ.get("NIGHTLAB_BUDGET", profile.budget_seconds))
    max_steps = int(os.environ.get("NIGHTLAB_MAX_STEPS", "0") or 0)
    folder = Path(data_dir) if data_dir is not None else default_data_dir(profile)
    return serve.local_connection(serve.ServerConfig(folder, profile.seq_len, budget, max_steps))


def training_batches(
    profile: Profile, batch_size: int, device: str, *, seed: int = 0, data_dir: Path | None = None
) -> TrainingClock:
    """The profile's training batches, served by the harness behind its clock.

    Args:
        profile: the lab's profile; by hand its budget and sequence length apply (inside the fleet
            the supervisor's, from the lab's own nightlab.toml).
        batch_size: rows per batch.
        device: where batches go; also picks the warm-up step count.
        seed: data order (`loader.train_batches`); the first clock of a run sets it.
        data_dir: the prepared data, by hand; default `profiles.data_dir(profile)`.

    `NIGHTLAB_BUDGET` / `NIGHTLAB_MAX_STEPS` shorten runs by hand, for tests and `nightlab tune`;
    the fleet strips both from every measured run, and its supervisor never reads the first.
    """
    if seed < 0:
        raise ValueError(f"seed must be 0 or positive, got {seed}")
    return TrainingClock(_connection(profile, data_dir), device=device, batch_size=batch_size, seed=seed)
