"""The batch server: the supervisor, not train.py, reads the training data and keeps the clock.

DO NOT CHANGE without a new epoch (bump `CLOCK_VERSION`): every built-in-target result's training
time and data are decided here.

The fleet's supervisor (`attempt.py`, outside the sandbox) runs a `BatchServer` on one end of a
socket pair and passes the other end to `train.py` (its descriptor number in `NIGHTLAB_BATCH_FD`).
`clock.training_batches(...)` in the training process only asks for batches; this process reads
the token files, packs the rows, and decides on its own clock (`time.monotonic`, which no edit of
train.py reaches) what each request gets:

    warm-up   the first request starts it; it ends at the first of `warmup_steps(device)` optimizer
              steps reported, or WARMUP_SECONDS_CAP seconds after the first batch, or
              WARMUP_FRACTION_CAP of the budget (the timed part then starts at the cap). Every
              batch served in it is the same batch (the first one packed): compilation and
              allocator warm-up need shapes, not fresh data, so a warm-up cannot train.
    timed     fresh batches from the packed stream until the budget is spent, then `stop` for
              every later request, from any clock object of the run: a second
              `training_batches(...)` is the same stream, never a new budget.
    hand-in   `handoff.hand_in` writes the model and then says so; the server notes the time and
              the supervisor copies the hand-in out of the run's reach at once (`on_handin`). The
              supervisor refuses a hand-in later than `grace_seconds(budget)` after the last batch
              served: training on cached batches past the budget gains at most that grace.

Protocol (little-endian, one request at a time, the client waits for each reply): a request is
`REQUEST` (op, flags, n, seed); n is the batch size for HELLO and the optimizer steps made since the
previous request otherwise. A batch reply is `BATCH` (status, rows, timed seconds so far) and then
rows x row_len token ids as raw uint16 (int32 when the vocabulary needs it), which the client
receives into a preallocated buffer. FIGURES and HANDIN replies are a length and a JSON object.
At the cpu profile a batch is 8 x 257 x 2 = 4 KiB; at h100 128 x 2049 x 2 = 512 KiB
(bench/RESULTS.md has the cost per batch).

Run by hand (`python train.py`, `nightlab tune`), `training_batches` starts the same server on a
thread of its own process (`local_connection`): one code path, no supervisor needed.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where rows are made: `identity` imports this module for CLOCK_VERSION
    import numpy as np

__all__ = [
    "CLOCK_VERSION",
    "FD_ENV",
    "WARMUP_FRACTION_CAP",
    "WARMUP_SECONDS_CAP",
    "BatchServer",
    "PackedRows",
    "ServingClock",
    "grace_seconds",
    "local_connection",
    "warmup_steps",
]

# 2: the supervisor serves the batches and keeps the clock; warm-up batches repeat one batch; a hand-in
# deadline (issue 30). Enters the epoch of every built-in-target lab (`identity.measurement`).
CLOCK_VERSION = 2
FD_ENV = "NIGHTLAB_BATCH_FD"  # set by the supervisor: the training process's end of the socket pair
GRACE_ENV = "NIGHTLAB_HANDIN_GRACE"  # seconds; tests only, read from the supervisor's own environment
WARMUP_SECONDS_CAP = 60.0  # a full-model torch.compile on an H100 takes ~30-50 s
WARMUP_FRACTION_CAP = 0.25  # ... but never more than a quarter of the budget (cpu profile: 7.5 s)
MAX_BATCH_BYTES = (
    1 << 30
)  # one batch of token ids; far above h100's 512 KiB, a guard for the supervisor's memory

OP_HELLO, OP_NEXT, OP_FIGURES, OP_HANDIN = 1, 2, 3, 4
FLAG_CUDA = 1
STATUS_BATCH, STATUS_STOP, STATUS_ERROR = 0, 1, 2
REQUEST = struct.Struct("<BBxxIq")  # op, flags, n, seed
HELLO = struct.Struct("<BxxxIIId")  # status, row_len, itemsize, max_steps, budget
BATCH = struct.Struct("<BxxxId")  # status, rows, timed seconds so far (-1 in the warm-up)
LENGTH = struct.Struct("<I")


def warmup_steps(device: str) -> int:
    """Untimed optimizer steps for a device: 10 on CUDA (compile, autotune), 2 elsewhere."""
    return 10 if str(device).startswith("cuda") else 2


def grace_seconds(budget: float) -> float:
    """Seconds from the last batch served to the hand-in: the last step, export and save, with room.

    10 s + budget / 60: cpu (30 s) 10.5 s, h100 (300 s) 15 s. Measured on the 2-core box at load
    11-43 (cpu profile, depth 2): last batch to hand-in 5.6-6.4 s (the last step, export, save);
    on a GPU not measured yet (bench/RESULTS.md). `NIGHTLAB_HANDIN_GRACE` replaces it, for tests.
    """
    override = os.environ.get(GRACE_ENV)
    return float(override) if override else 10.0 + budget / 60.0


class ProtocolError(Exception):
    """The training process sent something the protocol does not allow."""


# ---------------------------------------------------------------------------
# The clock: a pure rule over (time, steps), tested with a fake time


class ServingClock:
    """Decides what each batch request gets: `warmup`, `fresh` or `stop` (see the module docstring)."""

    def __init__(self, *, budget: float, max_steps: int = 0) -> None:
        self.budget = float(budget)
        self.max_steps = max_steps  # tests and `nightlab tune` only; the fleet never sets it
        self.warmup_cap = min(WARMUP_SECONDS_CAP, WARMUP_FRACTION_CAP * self.budget)
        self.warmup_steps = warmup_steps("cpu")  # the first HELLO sets the device's
        self.first: float | None = None  # first batch served
        self.timed_from: float | None = None  # end of warm-up
        self.last_request: float | None = None  # last request answered before the budget was spent
        self.last_served: float | None = None  # last batch served (warm-up or fresh)
        self.handed_in: float | None = None
        self.steps = 0
        self.steps_at_warmup = 0
        self.fresh = 0
        self.warmup_batches = 0
        self.exhausted = False

    def request(self, now: float, steps: int) -> str:
        """One batch request at `now`, after `steps` more optimizer steps: `warmup`, `fresh` or `stop`."""
        self.steps += steps
        if self.exhausted or self.handed_in is not None:
            return "stop"
        if self.first is None:
            self.first = now
        elif self.timed_from is None and (
            self.steps >= self.warmup_steps or now - self.first >= self.warmup_cap
        ):
            # never more than the cap untimed: time past it counts as training, and a step that ran
            # across the cap (reported with this request) is a timed step
            capped = now - self.first >= self.warmup_cap
            self.timed_from = min(now, self.first + self.warmup_cap)
            self.steps_at_warmup = self.steps - (1 if capped and steps > 0 else 0)
        self.last_request = now
        if self.timed_from is None:
            self.warmup_batches += 1
            self.last_served = now
            return "warmup"
        if (self.max_steps and self.steps >= self.max_steps) or (
            not self.max_steps and now - self.timed_from >= self.budget
        ):
            self.exhausted = True
            return "stop"
        self.fresh += 1
        self.last_served = now
        return "fresh"

    def timed(self, now: float) -> float:
        """Timed seconds so far at `now` (-1 during the warm-up)."""
        return -1.0 if self.timed_from is None else max(0.0, now - self.timed_from)

    def figures(self) -> dict[str, Any]:
        """The harness-owned timing keys, plus what the supervisor's checks need."""
        last = self.last_request if self.last_request is not None else 0.0
        first = self.first if self.first is not None else last
        timed_from = self.timed_from if self.timed_from is not None else last
        return {
            "training_seconds": round(max(0.0, last - timed_from), 3),
            "warmup_seconds": round(max(0.0, timed_from - first), 3),
            "warmup_steps": self.steps_at_warmup if self.timed_from is not None else self.steps,
            "steps": self.steps,
            "batches": self.fresh,
            "warmup_batches": self.warmup_batches,
            "budget_seconds": self.budget,
            "exhausted": self.exhausted,
        }


# ---------------------------------------------------------------------------
# Rows: the packed training stream


class PackedRows:
    """Rows of the training split packed best-fit (`loader.BestFitPacker`), in `seed`'s order."""

    def __init__(self, data_dir: Path, seq_len: int, seed: int) -> None:
        import numpy as np

        from nightlab.harness.cache import load_manifest, open_split
        from nightlab.harness.loader import DEFAULT_BUFFER_SIZE, BestFitPacker, _train_docs

        if seed < 0:
            raise ValueError(f"seed must be 0 or positive, got {seed}")
        manifest = load_manifest(Path(data_dir))
        split = open_split(Path(data_dir), "train", manifest)
        self.dtype = np.dtype("<u2") if manifest["tokenizer"]["vocab_size"] <= 1 << 16 else np.dtype("<i4")
        self.row_len = seq_len + 1
        self._packer = BestFitPacker(
            _train_docs(split.tokens, split.offsets, seed), self.row_len, DEFAULT_BUFFER_SIZE
        )

    def take(self, n: int) -> np.ndarray:
        """The next `n` rows, [n, row_len]."""
        return self._packer.next_batch(n, dtype=self.dtype)


# ---------------------------------------------------------------------------
# The server


@dataclass
class ServerConfig:
    """What the server needs to know before the training process says anything."""

    data_dir: Path
    seq_len: int
    budget: float
    max_steps: int = 0


class BatchServer:
    """Serves one run's batches over `sock` on its own clock (see the module docstring).

    Args:
        sock: the server's end of the socket pair.
        config: data, row length, budget.
        on_handin: called (in the serving thread) when the run says it handed in, before it is
            answered; the supervisor copies the hand-in out of the run's reach there.
        rows: rows factory `(seed) -> object with .take(n), .row_len, .dtype`; default `PackedRows`.
        now: the clock; `time.monotonic`.
    """

    def __init__(
        self,
        sock: socket.socket,
        config: ServerConfig,
        *,
        on_handin: Callable[[], None] | None = None,
        rows: Callable[[int], Any] | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sock = sock
        self.config = config
        self.clock = ServingClock(budget=config.budget, max_steps=config.max_steps)
        self.on_handin = on_handin
        self._rows_factory = rows or (lambda seed: PackedRows(config.data_dir, config.seq_len, seed))
        self._now = now
        self.started = now()
        self.seed: int | None = None  # the first HELLO's: the stream's order
        self.error: str | None = None  # the protocol was broken (the run is then invalid)
        self._rows: Any = None
        self._batch_size = 0
        self._warmup: np.ndarray | None = None
        self._ahead: np.ndarray | None = None  # the next fresh batch, packed while the run computes
        self._lock = threading.Lock()

    # -- socket helpers

    def _recv_exact(self, n: int) -> bytes | None:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if k == 0:
                if got:
                    raise ProtocolError("the run closed the connection in the middle of a request")
                return None
            got += k
        return bytes(buf)

    def _send_json(self, obj: dict[str, Any]) -> None:
        blob = json.dumps(obj).encode()
        self.sock.sendall(LENGTH.pack(len(blob)) + blob)

    # -- serving

    def serve(self) -> None:
        """Answer requests until the run closes its end (or breaks the protocol: `self.error`)."""
        try:
            while True:
                raw = self._recv_exact(REQUEST.size)
                if raw is None:
                    return
                op, flags, n, seed = REQUEST.unpack(raw)
                with self._lock:
                    self._answer(op, flags, n, seed)
        except ProtocolError as e:
            self.error = str(e)
        except OSError:  # the run's end is gone (killed, or closed by the supervisor)
            return

    def _answer(self, op: int, flags: int, n: int, seed: int) -> None:
        if op == OP_HELLO:
            self._hello(flags, n, seed)
        elif op == OP_NEXT:
            self._next(n)
        elif op == OP_FIGURES:
            self.clock.steps += n
            self._send_json(self.figures())
        elif op == OP_HANDIN:
            self.clock.steps += n
            if self.clock.handed_in is None:
                self.clock.handed_in = self._now()
                if self.on_handin is not None:
                    self.on_handin()
            self._send_json(self.figures())
        else:
            raise ProtocolError(f"unknown request {op}")

    def _hello(self, flags: int, batch_size: int, seed: int) -> None:
        row_len = self.config.seq_len + 1
        try:
            if batch_size < 1 or batch_size * row_len * 4 > MAX_BATCH_BYTES:
                raise ValueError(f"batch size {batch_size} rows of {row_len} tokens is out of range")
            if self._rows is None:
                self.seed = seed
                self.clock.warmup_steps = warmup_steps("cuda" if flags & FLAG_CUDA else "cpu")
                self._rows = self._rows_factory(seed)
        except Exception as e:  # the data is missing or damaged: the run gets the message, not a hang
            blob = f"{type(e).__name__}: {e}".encode()[:4000]
            self.sock.sendall(HELLO.pack(STATUS_ERROR, 0, 0, 0, 0.0) + LENGTH.pack(len(blob)) + blob)
            return
        if batch_size != self._batch_size:
            self._batch_size = batch_size
            self._ahead = None
        self.sock.sendall(
            HELLO.pack(
                STATUS_BATCH, row_len, self._rows.dtype.itemsize, self.clock.max_steps, self.clock.budget
            )
        )

    def _next(self, steps: int) -> None:
        if self._rows is None:
            raise ProtocolError("a batch was asked for before HELLO")
        now = self._now()
        kind = self.clock.request(now, steps)
        B = self._batch_size
        if kind == "stop":
            self.sock.sendall(BATCH.pack(STATUS_STOP, 0, self.clock.timed(now)))
            return
        if kind == "warmup":
            if self._warmup is None:
                self._warmup = self._rows.take(B)
            if len(self._warmup) != B:  # a second clock with another batch size: the same rows, tiled
                import numpy as np

                self._warmup = np.resize(self._warmup, (B, self._warmup.shape[1]))
            rows = self._warmup
        else:
            rows = self._ahead if self._ahead is not None else self._rows.take(B)
            self._ahead = None
        self.sock.sendall(BATCH.pack(STATUS_BATCH, B, self.clock.timed(now)) + rows.tobytes())
        if self._ahead is None:
            self._ahead = self._rows.take(B)  # pack the next one while the run computes

    def figures(self) -> dict[str, Any]:
        """The clock's figures, plus the times the supervisor checks (seconds since the server started)."""
        out = self.clock.figures()
        rel = lambda t: None if t is None else round(t - self.started, 3)  # noqa: E731
        out.update(
            seed=self.seed,
            last_served_at=rel(self.clock.last_served),
            handed_in_at=rel(self.clock.handed_in),
        )
        return out


# ---------------------------------------------------------------------------
# By hand: the server on a thread of the training process


_LOCAL: socket.socket | None = None


def local_connection(config: ServerConfig) -> socket.socket:
    """The client end of a server running on a thread of this process (one per process).

    For runs without a supervisor (`python train.py` by hand, `nightlab tune`): the same rules,
    measured by the same code, but nothing here protects them from the process they run in.
    """
    global _LOCAL
    if _LOCAL is None:
        mine, theirs = socket.socketpair()
        server = BatchServer(theirs, config)
        threading.Thread(target=server.serve, name="nightlab-batch-server", daemon=True).start()
        _LOCAL = mine
    return _LOCAL
