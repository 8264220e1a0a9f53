"""What a running experiment's log says right now: the latest training loss and progress.

Targets print progress in place with `\\r` (autoresearch: `step 00042 (12.3%) | loss:
3.123 | ...`; the built-in target: `step 00042 (12%) | loss 3.1234 | ...`), so a log
is split on both `\\r` and `\\n` and read from the end. Only the last 16 KiB are read:
progress lines are short, and a chatty target's log can be gigabytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from nightlab.fleet.runner import read_tail

TAIL_BYTES = 16 * 1024

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# `loss` or `train_loss` but not `val_loss`, then an optional `:` or `=`, then a number
_LOSS = re.compile(
    r"(?<!\w)(?:train_)?loss\s*[:=]?\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)", re.IGNORECASE
)
_PERCENT = re.compile(r"\(\s*(\d+(?:\.\d+)?)\s*%\s*\)")


@dataclass(frozen=True)
class LiveProgress:
    """The latest loss and the target's own progress percentage (None when not printed)."""

    loss: float | None
    percent: float | None
    line: str | None


def parse_progress(text: str) -> LiveProgress:
    """The last line of `text` that reports a loss, parsed.

    >>> parse_progress("step 00001 (0%) | loss: 9.0\\rstep 00042 (12.5%) | loss: 3.123 | lr 0.04\\r")
    LiveProgress(loss=3.123, percent=12.5, line='step 00042 (12.5%) | loss: 3.123 | lr 0.04')
    """
    for segment in reversed(re.split(r"[\r\n]", _ANSI.sub("", text))):
        found = _LOSS.findall(segment)
        if found:
            percent = _PERCENT.findall(segment)
            return LiveProgress(float(found[-1]), float(percent[-1]) if percent else None, segment.strip())
    return LiveProgress(None, None, None)


def log_progress(log_path: str | Path | None) -> LiveProgress:
    """`parse_progress` of the tail of a log file; empty when there is no log yet."""
    if not log_path:
        return LiveProgress(None, None, None)
    return parse_progress(read_tail(Path(log_path), TAIL_BYTES))
