"""Reading a finished run: the summary block, the log tail, and the class of its end.

Every target ends by printing a summary block (`---`, then `key: value` lines); the
last block in the log wins. Logs can be huge (a target that prints every step for
hours), so only the tail is ever read into memory. Classes of ending:

    ok                 summary with the metric, exit code 0
    crash:syntax       SyntaxError / IndentationError before anything ran
    crash:exception    any other exception (detail: its last line), or a self-raised fatal signal
    crash:oom          CUDA out of memory, MemoryError
    crash:nan          the target's `FAIL` line, or a NaN / inf metric
    crash:no-summary   exited 0 (or with an unexplained code) without a usable summary
    timeout            the hard time limit was reached and the process group killed
    infra              the process was killed from outside or vanished: retried elsewhere
    invalid            the run says its result cannot be trusted (causality probe, data fingerprint),
                       or a remote worker ran other nightlab code than the controller's

stdlib only (and the leaf `nightlab.outcome`): the controller imports this on its hot path, workers
and the dashboard import it too.
"""

from __future__ import annotations

import math
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nightlab.atomic import atomic_write_bytes
from nightlab.outcome import Outcome

TAIL_BYTES = 256 * 1024
KEEP_LOG_BYTES = 8 * 1024 * 1024

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")
_KEY_VALUE = re.compile(r"^\s*([A-Za-z_][\w.\-]*)\s*:\s*(.*?)\s*$")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?::.*)?$")
_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception): \S")
_OOM = re.compile(
    r"CUDA out of memory|OutOfMemoryError|HIP out of memory|MPS backend out of memory|MemoryError"
)
# Signals a process only dies of when it raised them itself (its own bug), as opposed to
# SIGKILL / SIGTERM / SIGHUP / SIGINT, which come from outside (OOM killer, preemption, operator).
_SELF_SIGNALS = {signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL}


@dataclass(frozen=True)
class RunResult:
    """What `classify` reads from a run's end: its outcome, a one-line explanation, the parsed summary."""

    outcome: Outcome
    detail: str | None
    metrics: dict[str, Any]


def clean_lines(text: str) -> list[str]:
    """Lines as a terminal would show them: ANSI codes removed, `\\r` progress overwritten."""
    text = _ANSI.sub("", text)
    # a trailing \r is a CRLF ending; any other \r returns the cursor, so only its last part shows
    return [line.rstrip("\r").rsplit("\r", 1)[-1] for line in text.split("\n")]


def _value(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text


def parse_summary(text: str) -> dict[str, Any] | None:
    """The last summary block in `text` as a dict, or None when there is none.

    Numeric values become floats (`nan` included); others stay strings.
    """
    lines = clean_lines(text)
    for start in range(len(lines) - 1, -1, -1):
        if lines[start].strip() != "---":
            continue
        block: dict[str, Any] = {}
        # indices, not `lines[start + 1:]`: a copy per `---` made a tail of 64k `---` lines take minutes
        for i in range(start + 1, len(lines)):
            match = _KEY_VALUE.match(lines[i])
            if not match:
                break
            block[match.group(1)] = _value(match.group(2))
        if block:
            return block
    return None


def read_tail(path: Path, limit: int = TAIL_BYTES) -> str:
    """The last `limit` bytes of a log, decoded leniently; empty when the file is missing."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            data = f.read()
    except FileNotFoundError:
        return ""
    text = data.decode("utf-8", errors="replace")
    if size > limit:
        text = text.split("\n", 1)[-1]  # drop the partial first line
    return text


def trim_log(path: Path, keep: int = KEEP_LOG_BYTES) -> None:
    """Cut a finished log down to its last `keep` bytes, so a chatty target cannot fill the disk."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if size <= keep:
        return
    with open(path, "rb") as f:
        f.seek(size - keep)
        data = f.read()
    head = f"[nightlab: {size - keep} earlier bytes of this log were dropped]\n".encode()
    try:
        atomic_write_bytes(path, head + data.split(b"\n", 1)[-1])
    except OSError:  # no room for the copy (a full disk): keep the whole log rather than fail the run
        return


def _last_exception(lines: list[str]) -> str | None:
    """The final `Type: message` line of the last traceback in the lines, if any."""
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if not starts:
        # a SyntaxError in the main script prints no "Traceback" header, and a target may
        # report its own error as one `SomethingError: message` line before exiting
        for line in reversed(lines):
            if line.startswith(("SyntaxError", "IndentationError", "TabError")):
                return line.strip()
        last = next((line.strip() for line in reversed(lines) if line.strip()), "")
        return last if _ERROR_LINE.match(last) else None
    found = None
    for line in lines[starts[-1] + 1 :]:
        if line and not line[0].isspace() and _EXCEPTION_LINE.match(line.rstrip()):
            found = line.strip()
    return found


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def expected_fingerprint(config: Any) -> str | None:
    """The data fingerprint every result of this lab must carry (built-in target only)."""
    if not config.profile:
        return None
    from nightlab.harness.profiles import Profile, fingerprint

    return fingerprint(Profile.from_dict(config.profile))


def expected_val_set(config: Any) -> str | None:
    """The validation set every harness score of this lab must carry (`demo` only), else None.

    The lab's set is the one in the controller's data folder for the lab's profile; its secret
    is made there on first use and handed to every worker's set-up (`fleet.sky_task`).
    """
    if not config.target.builtin or not config.profile:
        return None
    from nightlab.harness.cache import folder_val_secret, val_set_digest
    from nightlab.harness.profiles import Profile, data_dir, parse_dataset

    profile = Profile.from_dict(config.profile)
    if parse_dataset(profile.dataset)[0] != "demo":
        return None
    return val_set_digest(folder_val_secret(data_dir(profile)))


def max_training_seconds(config: Any, tier: str | None = None) -> float | None:
    """The most training time a run of this lab (on `tier`: a screening rung has its own budget)
    may report.

    The template stops at the first step that ends past the budget, so honest runs
    overshoot by one step: allow 10 % or 5 s, whichever is more.
    """
    if not config.profile:
        return None
    from nightlab.harness.profiles import Profile
    from nightlab.rungs import budget_of

    budget = Profile.from_dict(config.profile).budget_seconds
    if tier is not None:
        budget = budget_of(config, tier) or budget
    return budget + max(0.1 * budget, 5.0)


def classify(
    exit_code: int | None,
    log_text: str,
    *,
    metric: str,
    timed_out: bool = False,
    lost: bool = False,
    expected_fingerprint: str | None = None,
    max_training_seconds: float | None = None,
    code: str | None = None,
    expected_code: str | None = None,
) -> RunResult:
    """Classify one attempt from its exit code and the tail of its log.

    Args:
        exit_code: the shell's status (128 + N when the target died of signal N);
            negative N when the backend saw the signal directly; None when unknown.
        log_text: the tail of the log (see `read_tail`).
        metric: the summary key that must be present for `ok`.
        timed_out: the runner killed it at the hard limit.
        lost: the process vanished without leaving an exit status (worker death).
        expected_fingerprint: the lab's data fingerprint; a different one is `invalid`.
        max_training_seconds: a run that reports more training time than this is `invalid`
            (the budget is the lab's, not the run's to choose).
        code, expected_code: the code hash of the nightlab the worker ran and the
            controller's; when both are known and differ, the run is `invalid` whatever its
            end (its harness is not the one the controller verified).
    """
    summary = parse_summary(log_text) or {}
    if code and expected_code and code != expected_code:
        return RunResult(
            Outcome.INVALID,
            f"the worker ran nightlab `{code}`, the controller runs `{expected_code}`; "
            "run `nightlab fleet up --relaunch` to ship the controller's build",
            summary,
        )
    if timed_out:
        return RunResult(Outcome.TIMEOUT, "hard time limit reached; the process group was killed", summary)
    lines = clean_lines(log_text)
    signum = None
    if exit_code is not None and exit_code < 0:
        signum = -exit_code
    elif exit_code is not None and exit_code > 128:
        signum = exit_code - 128
    exception = _last_exception(lines)

    if exit_code == 0 and summary.get("invalid_reason"):
        return RunResult(Outcome.INVALID, str(summary["invalid_reason"]), summary)
    if metric in summary and exit_code == 0:
        value = summary[metric]
        if not isinstance(value, float) or math.isnan(value) or math.isinf(value):
            return RunResult(Outcome.CRASH_NAN, f"metric `{metric}` is {value}", summary)
        found = summary.get("data_fingerprint")
        if expected_fingerprint and found is not None and str(found) != expected_fingerprint:
            return RunResult(
                Outcome.INVALID,
                f"data fingerprint `{found}` differs from the lab's `{expected_fingerprint}`; "
                "run `nightlab prepare` on that worker",
                summary,
            )
        trained = summary.get("training_seconds")
        if max_training_seconds and isinstance(trained, float) and trained > max_training_seconds:
            return RunResult(
                Outcome.INVALID,
                f"trained {trained:.1f} s, more than the lab's budget allows ({max_training_seconds:.1f} s)",
                summary,
            )
        return RunResult(Outcome.OK, None, summary)

    fail = next((line.strip() for line in reversed(lines) if line.startswith("FAIL")), None)
    if fail:
        return RunResult(Outcome.CRASH_NAN, fail, summary)
    if exception:
        kind = exception.split(":", 1)[0]
        if kind in ("SyntaxError", "IndentationError", "TabError"):
            return RunResult(Outcome.CRASH_SYNTAX, exception, summary)
        if _OOM.search(exception) or kind.endswith("OutOfMemoryError"):
            return RunResult(Outcome.CRASH_OOM, exception, summary)
        return RunResult(Outcome.CRASH_EXCEPTION, exception, summary)
    if any(_OOM.search(line) for line in lines[-50:]):
        return RunResult(Outcome.CRASH_OOM, "out of memory", summary)
    if lost:
        return RunResult(Outcome.INFRA, "the run vanished without an exit status (worker lost)", summary)
    if signum is not None:
        name = _signal_name(signum)
        if signum in {int(s) for s in _SELF_SIGNALS}:
            return RunResult(Outcome.CRASH_EXCEPTION, f"died of {name}", summary)
        return RunResult(Outcome.INFRA, f"killed by {name} from outside", summary)
    if exit_code == 0:
        if summary:
            return RunResult(Outcome.CRASH_NO_SUMMARY, f"summary block has no `{metric}`", summary)
        return RunResult(Outcome.CRASH_NO_SUMMARY, "exited 0 without a summary block", summary)
    if exit_code is None:
        return RunResult(Outcome.INFRA, "exit status unknown", summary)
    if metric in summary:
        return RunResult(
            Outcome.CRASH_EXCEPTION, f"printed a summary but exited with code {exit_code}", summary
        )
    return RunResult(Outcome.CRASH_EXCEPTION, f"exited with code {exit_code} and no traceback", summary)
