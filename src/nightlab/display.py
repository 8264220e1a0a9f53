"""How figures read: one rule for `show`, the dashboard, the reports and the demo's story.

The ledger stores every numeric summary value as a SQLite REAL, so `num_steps: 273` comes back
as `273.0` and `tok_per_sec: 18445` as `18445.0`; printed with a metric's six decimals they read
`273.000000`. The rule here:

- the lab's metric keeps six decimals (`val_bpb 0.997900`: its differences live in the 3rd-4th);
- an integral value prints as an integer (`num_steps 273`, `depth 2`, `tok_per_sec 18445`);
- any other number gets sensible digits: one decimal from 100 up (`peak_vram_mb 45060.2`,
  `training_seconds 300.1`), else four significant ones (`mfu_percent 39.8`, `MATRIX_LR 0.04`);
- text stays as it is, None is `-`.

`peak_vram_mb` is the device's memory on a GPU, but the process's peak RSS on a CPU (the
built-in target reports `accel.peak_memory_mb()`), so on a CPU run the views say so (`note`).

Usage:
    number(273.0) == "273"; number(0.9979, metric=True) == "0.997900"; number(45060.23) == "45060.2"
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

__all__ = ["clock", "exact", "fact", "metric_note", "number"]

_INTEGRAL_LIMIT = 2**53  # beyond it a float no longer holds every integer: print it as a float


def number(value: Any, *, metric: bool = False) -> str:
    """A summary value as people read it (see the module docstring for the rule).

    Args:
        value: a number, a string (kept), or None (`-`).
        metric: whether the value is the lab's metric (always six decimals).
    """
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if metric:
        return f"{value:.6f}"
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    if value.is_integer() and abs(value) < _INTEGRAL_LIMIT:
        return str(int(value))
    if abs(value) >= 100:
        return f"{value:.1f}"
    return f"{value:.4g}"


def exact(value: Any) -> str:
    """A summary value for files that machines read (results-wide.tsv): integral values as
    integers, every other number with all its digits, None as empty."""
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer() and abs(value) < _INTEGRAL_LIMIT:
        return str(int(value))
    return str(value)


def metric_note(key: str, metrics: dict[str, Any]) -> str | None:
    """What a summary key means where its name says otherwise, or None.

    On a CPU run `peak_vram_mb` is the process's peak resident memory: there is no VRAM.
    """
    if key == "peak_vram_mb" and str(metrics.get("device", "")).lower().startswith("cpu"):
        return "peak RSS on CPU"
    return None


def clock(ts: float | None) -> str:
    """An epoch time as local `YYYY-MM-DD HH:MM:SS` (`-` for None)."""
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def fact(key: str, value: Any) -> str:
    """A stored value (a wave's spec, an agent's state) as one readable line, never a Python repr.

    Times (`*_at` keys) read as clocks, numbers follow `number`, None is `-`, a mapping reads
    `k=v k=v` (unset entries left out: `max_hours=None` is no limit), a list `a, b`, and anything
    nested inside them compact JSON.
    """
    if value is None:
        return "-"
    if key.endswith("_at") and isinstance(value, (int, float)) and not isinstance(value, bool):
        return clock(value)
    if isinstance(value, dict):
        return " ".join(f"{k}={_inner(v)}" for k, v in value.items() if v is not None) or "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(_inner(v) for v in value) or "-"
    return number(value)


def _inner(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, separators=(",", ":"), default=str)
    return number(value)


def ago(ts: float | None) -> str:
    """How long ago `ts` was, as `duration` writes it (`-` for None)."""
    if ts is None:
        return "-"
    return duration(time.time() - ts)


def duration(seconds: float | None) -> str:
    """`42s`, `3.5m` or `2.1h` (`-` for None): the unit a person reads at a glance."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"
