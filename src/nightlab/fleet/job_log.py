"""Reading a SkyPilot job's log back: its own output, and the tags its run script printed.

Logs come back through `sky.tail_logs` with SkyPilot's `(task, pid=1234) ` prefix on every
line of the job's output and its own progress lines in between (a resident runner's log has no
prefixes); `JobLogSink` keeps the job's lines, strips the prefixes and takes out the lines the
run script adds (`fleet/templates/run.sh`: `nightlab-gpu:`, `-start:`, `-end:`, `-code:`,
`-score:`, `-health:`, `-exit:`), writing as the log streams in. The score and the health come
base64-encoded as JSON and are read here (`save_score`, `read_health`); `add_run_keys` joins
`tier:`, `gpu_name:` and the code hash to the summary block the controller classifies.
"""

from __future__ import annotations

import base64
import io
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from nightlab.harness.names import SCORE_FILE

_COLOR = r"(?:\x1b\[[0-9;]*m)*"
_PREFIX = re.compile(rf"^{_COLOR}\([^()\n]*\bpid=\d+[^()\n]*\){_COLOR} ?")
# Unanchored, last occurrence: a run that ends with half a line (no newline) would otherwise swallow the
# run script's next tag. A tag's authority is its order (the run script prints last), not its column.
_TAG = re.compile(r"^.*nightlab-(gpu|exit|code|version|torch|sandbox|score|health|start|end): ?(.*?)\s*$")


OTHER_FORMAT_LIMIT = 8 * 1024 * 1024  # chars of unprefixed lines kept in case no line has a prefix


class JobLogSink(io.TextIOBase):
    """An `output_stream` for `sky.tail_logs` that writes the job's own output to `out`.

    Lines with SkyPilot's `(name, pid=N)` prefix are the job's: the prefix goes, the run
    script's tags (`nightlab-gpu:`, `nightlab-exit:`) go to `tags`, the rest is written at
    once (so a followed log can be watched while the job runs, and a chatty job's log never
    sits in memory). Lines without a prefix are SkyPilot's progress output and are dropped,
    unless no line has a prefix at all (another SkyPilot log format): then `finish` writes
    those (the last `OTHER_FORMAT_LIMIT` characters).
    """

    def __init__(
        self,
        out: IO[str] | Path,
        *,
        active: Callable[[], bool] | None = None,
        on_tag: Callable[[str, str], None] | None = None,
        raw: bool = False,
    ) -> None:
        super().__init__()
        self._raw = raw  # every line is the job's own: a resident runner's log has no SkyPilot prefix
        self.tags: dict[str, str] = {}
        self._on_tag = on_tag  # told of each tag as it streams in (the job's start)
        self._active = active  # False once another reader owns `out`: stop writing there
        if isinstance(out, Path):
            out.write_text("")  # a fresh log per read; appended batch by batch, never held open
        self._out = out
        self._partial = ""
        self._prefixed = False
        self._other: list[str] = []
        self._other_size = 0

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        lines = (self._partial + s).split("\n")
        self._partial = lines.pop()
        self._take(lines)
        return len(s)

    def finish(self) -> None:
        """Take the last unterminated line, and write the unprefixed lines if nothing had a prefix."""
        if self._partial:
            self._take([self._partial])
            self._partial = ""
        if not self._prefixed and not self._raw:
            self._emit(self._other)

    def _take(self, lines: list[str]) -> None:
        if self._raw:
            self._emit(lines)
            return
        own = []
        for line in lines:
            if _PREFIX.match(line):
                self._prefixed = True
                own.append(_PREFIX.sub("", line, count=1))
            elif not self._prefixed:
                self._other.append(line)
                self._other_size += len(line) + 1
                while self._other_size > OTHER_FORMAT_LIMIT and len(self._other) > 1:
                    self._other_size -= len(self._other.pop(0)) + 1
        if own:
            self._emit(own)

    def _emit(self, lines: list[str]) -> None:
        kept = []
        for line in lines:
            match = _TAG.match(line)
            if match:
                self.tags[match.group(1)] = match.group(2)
                if self._on_tag is not None:
                    self._on_tag(match.group(1), match.group(2))
            else:
                kept.append(line + "\n")
        if self._active is not None and not self._active():
            return
        if isinstance(self._out, Path):
            with open(self._out, "a") as f:
                f.write("".join(kept))
        else:
            self._out.write("".join(kept))


def clean_job_log(text: str) -> tuple[str, dict[str, str]]:
    """The job's own output in a `tail_logs` text, and the run script's tags (see `JobLogSink`).

    Returns:
        (log text, {"gpu": name, "exit": code}) with the tags found.
    """
    out = io.StringIO()
    sink = JobLogSink(out)
    sink.write(text)
    sink.finish()
    return out.getvalue(), sink.tags


def run_keys(log_tail: str, *, tier: str, gpu: str | None, code: str | None = None) -> str:
    """The lines to append to a log so its summary block carries `tier`, `gpu_name` and `nightlab_code`.

    Empty unless the summary block ends the log: lines added after a traceback would read
    as its exception line.
    """
    from nightlab.fleet.runner import clean_lines, parse_summary

    if parse_summary(log_tail) is None:
        return ""
    lines = [line for line in clean_lines(log_tail) if line.strip()]
    start = max(i for i, line in enumerate(lines) if line.strip() == "---")
    if not all(re.match(r"^\s*[A-Za-z_][\w.\-]*\s*:", line) for line in lines[start + 1 :]):
        return ""
    extra = f"tier: {tier}\n" + (f"gpu_name: {gpu}\n" if gpu and gpu != "none" else "")
    extra += f"nightlab_code: {code}\n" if code and code != "none" else ""
    return ("" if log_tail.endswith("\n") else "\n") + extra


def save_score(run_dir: Path, tags: dict[str, str], *, worker_sandbox: str | None = None) -> bool:
    """Write the supervisor's `score.json` that came back on the job's `nightlab-score:` line.

    Why that line is the harness's and not train.py's, which shares the job's output: the run
    script prints it after the supervisor exited, and in the sandbox (a PID namespace that dies
    with it) no process of the run is left to print anything later. A line the run printed
    before is overwritten (the last tag wins, `JobLogSink`), and a tag counts anywhere in its
    line, so half a line left without a newline cannot swallow it. A run that never reaches
    that line (killed at its deadline, preempted, cancelled) leaves what it printed last; the
    controller ignores any score for such an end (`owned.apply_score`). Unsandboxed, a run can
    kill the run script and speak last: it vouches for nothing (docs/integrity.md), so when the
    worker's set-up probe found no working sandbox (`worker_sandbox="none"`, printed by the
    launch job, before any experiment ran there) the score is marked `sandbox: none` whatever it
    says.

    Returns:
        Whether a score was written (False for no line, `none`, or an unreadable one: the
        controller then records "no harness score").
    """
    from nightlab.atomic import atomic_write_json

    data = _tag_json(tags, "score")
    if data is None:
        return False
    if worker_sandbox == "none" and data.get("sandbox") != "none":
        data.update(sandbox="none", unsandboxed="the worker's set-up probe found no working bubblewrap")
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    atomic_write_json(Path(run_dir) / SCORE_FILE, data, indent=1, sort_keys=True)
    return True


def _tag_json(tags: dict[str, str], key: str) -> dict[str, Any] | None:
    """The JSON object a run-script tag carries base64-encoded; None for no tag, `none`, or garbage."""
    import binascii
    import json

    raw = tags.get(key)
    if not raw or raw == "none":
        return None
    try:
        data = json.loads(base64.b64decode(raw, validate=True))
    except (ValueError, binascii.Error):
        return None
    return data if isinstance(data, dict) else None


def read_health(tags: dict[str, str]) -> dict[str, Any] | None:
    """The worker's health sample from the job's `nightlab-health:` line (printed after the run
    ended, like the score). Not validated here: `Health.from_report` keeps only well-formed figures."""
    return _tag_json(tags, "health")


SUPERVISOR_LINE = "nightlab harness:"  # how the supervisor's own lines start (`harness/attempt.py`)


def add_run_keys(log_path: Path, *, tier: str, gpu: str | None, code: str | None) -> None:
    """Join `run_keys` to the summary block of a finished job's log, in place.

    A supervised run's log ends with the supervisor's lines after train.py's block; the keys go
    before them (the block must stay one run of `key: value` lines), so only the tail is rewritten.
    """
    from nightlab.fleet.runner import read_tail

    tail = read_tail(log_path)
    lines = tail.splitlines(keepends=True)
    cut = len(lines)
    while cut and (not lines[cut - 1].strip() or lines[cut - 1].startswith(SUPERVISOR_LINE)):
        cut -= 1
    head, suffix = "".join(lines[:cut]), "".join(lines[cut:])
    extra = run_keys(head, tier=tier, gpu=gpu, code=code)
    if not extra:
        return
    size = log_path.stat().st_size
    with open(log_path, "r+b") as f:
        f.truncate(size - len(suffix.encode("utf-8", errors="replace")))
        f.seek(0, os.SEEK_END)
        f.write((extra + suffix).encode())
