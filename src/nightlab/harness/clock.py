"""The training clock: the harness, not train.py, decides how long a run trains.

DO NOT CHANGE without a new epoch: every result's training time is measured here.

`training_batches(profile, batch_size, device, seed=...)` wraps the harness's training-batch
iterator in a `TrainingClock`. The clock stops serving batches (the loop's `for` ends) once the
timed training time reaches the profile's budget; `clock.step()` marks an optimizer step and
`clock.progress` (0..1) drives a schedule. The untimed warm-up (compilation, allocator, first
kernels) is one fixed rule for every run, not the loop's choice:

    warm-up ends at the first of: `warmup_steps(device)` calls of `step()` (10 on CUDA, 2
    elsewhere, the template's old per-device values), or WARMUP_SECONDS_CAP seconds after the
    first batch was served, or WARMUP_FRACTION_CAP of the budget. A step that runs past the
    cap counts from the cap on, so the untimed part never exceeds it; a loop that never calls
    `step()` gets the seconds cap, never more.

The clock's figures (`figures()`) travel with the handed-in model (`handoff.hand_in`), so the
summary's `training_seconds` is the harness's figure. The clock runs inside the training process,
so a determined edit can tamper with it; what bounds that is the supervisor's own measurement
of the process's wall time (`attempt.py`), which the training process cannot reach.

Usage:
    batches = training_batches(profile, DEVICE_BATCH_SIZE, device, seed=seed)
    for x, y in batches: ...; batches.step()  # after each optimizer step
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nightlab.harness.profiles import Profile

__all__ = ["WARMUP_SECONDS_CAP", "ClockFigures", "TrainingClock", "training_batches", "warmup_steps"]

WARMUP_SECONDS_CAP = 60.0  # a full-model torch.compile on an H100 takes ~30-50 s
WARMUP_FRACTION_CAP = 0.25  # ... but never more than a quarter of the budget (cpu profile: 7.5 s)


def warmup_steps(device: str) -> int:
    """Untimed optimizer steps for a device: 10 on CUDA (compile, autotune), 2 elsewhere."""
    return 10 if str(device).startswith("cuda") else 2


@dataclass(frozen=True)
class ClockFigures:
    """What the clock measured: the harness-owned timing keys of a run."""

    training_seconds: float  # timed training: from the end of warm-up to the last batch served
    warmup_seconds: float  # untimed: from the first batch to the end of warm-up
    warmup_steps: int  # optimizer steps inside the warm-up
    steps: int  # optimizer steps marked with `step()`
    batches: int  # batches served
    budget_seconds: float
    exhausted: bool  # the clock stopped serving because the budget was spent

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class TrainingClock:
    """Serves training batches until the budget is spent (see the module docstring)."""

    def __init__(
        self,
        batches: Iterator[Any],
        *,
        budget: float,
        device: str,
        batch_size: int,
        seq_len: int,
        seed: int = 0,
        max_steps: int = 0,
    ) -> None:
        self._batches = batches
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.seed = seed
        self._budget = float(budget)
        self.device = str(device)
        self.max_steps = max_steps  # tests and `nightlab tune` only; the fleet never sets it
        self._warmup_steps = warmup_steps(self.device)
        self._warmup_cap = min(WARMUP_SECONDS_CAP, WARMUP_FRACTION_CAP * self._budget)
        self._first: float | None = None  # when the first batch was served
        self._timed_from: float | None = None  # end of warm-up
        self._last: float | None = None  # when the last batch was served (or refused)
        self._steps = 0
        self._steps_at_warmup = 0
        self._served = 0
        self._exhausted = False

    @property
    def budget(self) -> float:
        """The training budget in seconds (the profile's, or `NIGHTLAB_BUDGET` in tests)."""
        return self._budget

    def __iter__(self) -> TrainingClock:
        return self

    def _now(self) -> float:
        if self.device.startswith("cuda"):  # time finished work, not queued kernels
            import torch

            torch.cuda.synchronize()
        return time.perf_counter()

    def _end_warmup(self, now: float, *, straddled: bool = False) -> None:
        if self._timed_from is None and self._first is not None:
            # never more than the cap untimed: a slow first step counts past the cap, and a step
            # that ran across the cap is a timed step (its tokens count with its timed part)
            capped = now >= self._first + self._warmup_cap
            self._timed_from = min(now, self._first + self._warmup_cap)
            self._steps_at_warmup = self._steps - (1 if straddled and capped else 0)

    def __next__(self) -> Any:
        now = self._now()
        if self._first is None:
            self._first = now
        elif now - self._first >= self._warmup_cap:
            self._end_warmup(now)
        self._last = now
        if self._exhausted or self._spent(now):
            self._exhausted = True
            raise StopIteration
        self._served += 1
        return next(self._batches)

    def _spent(self, now: float) -> bool:
        if self.max_steps:
            return self._steps >= self.max_steps
        return self._timed_from is not None and now - self._timed_from >= self._budget

    def step(self) -> None:
        """Mark the end of one optimizer step (warm-up counts steps)."""
        self._steps += 1
        if self._timed_from is None and self._first is not None:
            now = self._now()
            if self._steps >= self._warmup_steps or now - self._first >= self._warmup_cap:
                self._end_warmup(now, straddled=True)

    @property
    def progress(self) -> float:
        """Fraction of the budget used, 0..1 (of max_steps when that is set)."""
        if self.max_steps:
            return min(self._steps / self.max_steps, 1.0)
        if self._timed_from is None:
            return 0.0
        return min((time.perf_counter() - self._timed_from) / self._budget, 1.0)

    @property
    def steps(self) -> int:
        return self._steps

    def figures(self) -> ClockFigures:
        """The clock's measurements so far."""
        last = self._last if self._last is not None else time.perf_counter()
        first = self._first if self._first is not None else last
        timed_from = self._timed_from if self._timed_from is not None else last
        return ClockFigures(
            training_seconds=round(max(0.0, last - timed_from), 3),
            warmup_seconds=round(max(0.0, timed_from - first), 3),
            warmup_steps=self._steps_at_warmup if self._timed_from is not None else self._steps,
            steps=self._steps,
            batches=self._served,
            budget_seconds=self._budget,
            exhausted=self._exhausted,
        )


def training_batches(
    profile: Profile, batch_size: int, device: str, *, seed: int = 0, data_dir: Path | None = None
) -> TrainingClock:
    """The profile's training batches behind the harness's clock.

    Args:
        profile: the lab's profile; its budget and sequence length apply.
        batch_size: rows per batch.
        device: where batches go; also picks the warm-up step count.
        seed: data order (`loader.train_batches`).
        data_dir: the prepared data; default `profiles.data_dir(profile)`.

    `NIGHTLAB_BUDGET` / `NIGHTLAB_MAX_STEPS` shorten runs for tests and `nightlab tune`; the fleet
    strips both from every measured run.
    """
    from nightlab.harness.loader import train_batches
    from nightlab.harness.profiles import data_dir as default_data_dir

    budget = float(os.environ.get("NIGHTLAB_BUDGET", profile.budget_seconds))
    max_steps = int(os.environ.get("NIGHTLAB_MAX_STEPS", "0"))
    folder = Path(data_dir) if data_dir is not None else default_data_dir(profile)
    inner = train_batches(folder, batch_size, profile.seq_len, device, seed=seed)
    return TrainingClock(
        inner,
        budget=budget,
        device=device,
        batch_size=batch_size,
        seq_len=profile.seq_len,
        seed=seed,
        max_steps=max_steps,
    )
