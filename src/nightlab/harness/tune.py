"""`nightlab tune`: measure the device paths of a lab's train.py and keep the fastest.

A path can run correctly and still be catastrophically slow (on an RTX 5090 the stock setup
trained at a few thousand tokens/s), so the choice of full-model compile, attention backend and
DEVICE_BATCH_SIZE is measured, not guessed. Each candidate runs the lab's own train.py for a few
steps in a fresh process (so one candidate's compile cache, allocator state or OOM cannot affect
the next) with `NIGHTLAB_MAX_STEPS` and `NIGHTLAB_SKIP_EVAL` set; train.py reports steady-state
tokens/s (its warmup steps excluded) and peak memory in its summary block. The fastest candidate
that ran is written into the lab's train.py knobs (COMPILE, ATTENTION, DEVICE_BATCH_SIZE),
byte-exact apart from those values, but only when it beats the current setting beyond the spread.

Spread: one short measurement is noise (a 1.7 % tok/s difference was once crowned "fastest").
Every candidate, and the current setting (added when it is not among them), runs `repeats`
times (default 3, each a fresh process); its figure is the mean with a 95 % Student-t interval
(mean ± t(0.975, n-1) s / sqrt(n)). The winner is written only when its interval lies wholly
above the current setting's; otherwise train.py is left alone and the reason says by how much
the intervals overlap. More repeats narrow the intervals (`--repeats`).

TOTAL_BATCH_SIZE is left alone: it changes the optimisation, not just the speed, so it is a
research question for `nightlab submit`, not a device setting.

Usage:
    result = tune(Path("mylab"), steps=30)
    result.best, result.written   # the winning row, the knob values written into train.py
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nightlab.atomic import atomic_write_text
from nightlab.errors import NightlabError, UsageError

__all__ = ["Candidate", "TuneResult", "TuneRow", "tune"]

_REQUIRED_KNOBS = ("DEVICE_BATCH_SIZE", "TOTAL_BATCH_SIZE", "COMPILE", "ATTENTION")
_OOM_MARKERS = ("out of memory", "OutOfMemoryError", "CUBLAS_STATUS_ALLOC_FAILED")


@dataclass(frozen=True)
class Candidate:
    """One device setting to measure: full-model compile on/off, attention backend, rows per pass."""

    compile: str
    attention: str
    device_batch_size: int


@dataclass(frozen=True)
class TuneRow:
    """The measurement of one candidate.

    Attributes:
        candidate: what was asked for.
        status: "ok", "oom", "crash" or "timeout".
        tok_per_sec: steady-state training tokens/s (warmup steps excluded); None unless ok.
        peak_memory_mb: peak device memory (peak RSS on CPU); None unless ok.
        startup_seconds: everything but the timed steps (imports, compile, warmup); None unless ok.
            Not part of the choice (the budget excludes it), shown so its cost is visible.
        compiled: whether the model actually ran compiled (a failed compile falls back to eager).
        attention: the attention backend that actually ran.
        detail: the last line of the output when the candidate failed.
    """

    candidate: Candidate
    status: str
    tok_per_sec: float | None = None  # the mean over `runs`
    runs: tuple[float, ...] = ()  # tokens/s of each repeat
    spread: float | None = None  # half-width of the 95 % interval of the mean (None below 2 runs)
    peak_memory_mb: float | None = None
    startup_seconds: float | None = None
    compiled: bool | None = None
    attention: str | None = None
    detail: str = ""


@dataclass(frozen=True)
class TuneResult:
    """All rows (in the order run), the fastest ok row, and the knob values written (empty if not written).

    `current` is the row of the setting train.py had; `reason` says why the knobs were or were not
    written (the winner's interval against the current one's).
    """

    rows: list[TuneRow]
    best: TuneRow
    written: dict[str, str] = field(default_factory=dict)
    current: TuneRow | None = None
    reason: str = ""
    beats_current: bool = False


# two-sided 95 % Student t quantiles by degrees of freedom; above 9 the normal-ish 2.0
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def interval(values: Sequence[float]) -> tuple[float, float | None]:
    """(mean, half-width of its 95 % t interval); the half-width is None for fewer than 2 values."""
    import statistics

    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None
    return mean, _T95.get(len(values) - 1, 2.0) * statistics.stdev(values) / len(values) ** 0.5


def _repeat(rows: list[TuneRow]) -> TuneRow:
    """One row from the repeats of a candidate: the first failure, or the mean and its interval."""
    failed = next((r for r in rows if r.status != "ok"), None)
    if failed is not None:
        return failed
    runs = tuple(r.tok_per_sec or 0.0 for r in rows)
    mean, spread = interval(runs)
    first = rows[0]
    return TuneRow(
        first.candidate,
        "ok",
        tok_per_sec=mean,
        runs=runs,
        spread=spread,
        peak_memory_mb=max(r.peak_memory_mb or 0.0 for r in rows),
        startup_seconds=first.startup_seconds,
        compiled=first.compiled,
        attention=first.attention,
    )


def decide(best: TuneRow, current: TuneRow | None) -> tuple[bool, str]:
    """Whether `best` beats `current` beyond their spread, and the sentence that says so."""
    if current is None or current.status != "ok" or current.tok_per_sec is None:
        return True, "the current setting did not run" if current is not None else "no current setting"
    if best is current or best.candidate == current.candidate:
        return False, "the current setting is the fastest"
    low = (best.tok_per_sec or 0.0) - (best.spread or 0.0)
    high = current.tok_per_sec + (current.spread or 0.0)
    gain = (best.tok_per_sec or 0.0) / current.tok_per_sec - 1
    if best.spread is None or current.spread is None:
        return False, f"{gain:+.1%} from one run each: no spread to judge it by; measure with repeats >= 2"
    if low > high:
        return True, f"{gain:+.1%} tok/s, beyond the spread ({low:,.0f} > {high:,.0f})"
    return False, (
        f"{gain:+.1%} tok/s is within the spread (intervals overlap: {low:,.0f} <= {high:,.0f}); "
        "train.py is unchanged; more `--repeats` may settle it"
    )


def _parse_summary(output: str) -> dict[str, str]:
    """The last `---` block of `key: value` lines (the summary contract)."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == "---"]
    summary: dict[str, str] = {}
    if starts:
        for line in lines[starts[-1] + 1 :]:
            key, sep, value = line.partition(":")
            if sep and key.strip() and " " not in key.strip():
                summary[key.strip()] = value.strip()
    return summary


def _default_batch_sizes(current: int, total: int, seq_len: int) -> list[int]:
    """Half, same and double the current DEVICE_BATCH_SIZE, where gradient accumulation still divides."""
    options = {max(1, current // 2), current, current * 2}
    return sorted(b for b in options if total % (b * seq_len) == 0)


def _run_candidate(workdir: Path, source: str, candidate: Candidate, steps: int, timeout: float) -> TuneRow:
    from nightlab.search.knobs import set_knobs

    variant = set_knobs(
        source,
        {
            "COMPILE": repr(candidate.compile),
            "ATTENTION": repr(candidate.attention),
            "DEVICE_BATCH_SIZE": str(candidate.device_batch_size),
        },
    )
    (workdir / "train.py").write_bytes(variant.encode("utf-8"))
    env = {**os.environ, "NIGHTLAB_MAX_STEPS": str(steps), "NIGHTLAB_SKIP_EVAL": "1"}
    # A session of its own, so a timeout also ends the compile workers the run started.
    proc = subprocess.Popen(
        [sys.executable, "train.py"],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return TuneRow(candidate, "timeout", detail=f"no result within {timeout:g}s")
    summary = _parse_summary(output)
    if proc.returncode != 0 or "tok_per_sec" not in summary:
        tail = [line for line in output.splitlines() if line.strip()]
        status = "oom" if any(m in output for m in _OOM_MARKERS) else "crash"
        return TuneRow(candidate, status, detail=tail[-1][:200] if tail else f"exit {proc.returncode}")
    try:
        tok_per_sec = float(summary["tok_per_sec"])
        peak_memory_mb = float(summary.get("peak_vram_mb", "nan"))
        startup_seconds = float(summary.get("startup_seconds", "nan"))
    except ValueError:
        return TuneRow(candidate, "crash", detail=f"unreadable summary: {summary}")
    if tok_per_sec <= 0:
        return TuneRow(
            candidate, "crash", detail=f"no timed steps: raise steps `{steps}` above the warmup steps"
        )
    return TuneRow(
        candidate,
        "ok",
        tok_per_sec=tok_per_sec,
        peak_memory_mb=peak_memory_mb,
        startup_seconds=startup_seconds,
        compiled=summary.get("compile") == "on",
        attention=summary.get("attention", candidate.attention),
    )


def _print_table(rows: list[TuneRow], best: TuneRow | None, current: TuneRow | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="nightlab tune: steady-state training throughput (mean ± 95 % interval)")
    numeric = ("batch", "tok/s", "peak MB", "start-up s")
    for column in ("compile", "attention", "batch", "status", "tok/s", "peak MB", "start-up s", "note"):
        table.add_column(column, justify="right" if column in numeric else "left")
    for row in rows:
        c = row.candidate
        ran = ""
        if row.status == "ok" and (row.compiled != (c.compile == "on") or row.attention != c.attention):
            ran = f"ran compile={'on' if row.compiled else 'off'} attention={row.attention}"
        table.add_row(
            c.compile,
            c.attention,
            str(c.device_batch_size),
            row.status,
            (f"{row.tok_per_sec:,.0f}" + (f" ± {row.spread:,.0f}" if row.spread is not None else ""))
            if row.tok_per_sec is not None
            else "",
            f"{row.peak_memory_mb:,.0f}" if row.peak_memory_mb is not None else "",
            f"{row.startup_seconds:.1f}" if row.startup_seconds is not None else "",
            ("fastest " if row is best else "")
            + ("current " if row is current else "")
            + (ran or row.detail),
            style="bold green" if row is best else None,
        )
    Console(stderr=True).print(table)
    print(f"each figure: the mean of {max((len(r.runs) for r in rows), default=0)} runs", file=sys.stderr)


def _read_train_py(lab_dir: Path) -> tuple[Path, str, dict[str, Any]]:
    """The lab's train.py, its text and its knobs; a `UsageError` when one that tune sets is missing."""
    from nightlab.search.knobs import list_knobs

    train_py = lab_dir / "train.py"
    if not train_py.is_file():
        raise UsageError(
            f"no train.py in `{lab_dir}`; run tune in a lab made by `nightlab init --profile NAME`"
        )
    source = train_py.read_bytes().decode("utf-8")  # bytes: keep CRLF line endings as they are
    knobs = {k.name: k.value for k in list_knobs(source)}
    missing = [k for k in _REQUIRED_KNOBS if k not in knobs]
    if missing:
        raise UsageError(
            f"train.py has no knob `{missing[0]}`; tune sets {', '.join(_REQUIRED_KNOBS)}: restore them from "
            "the template"
        )
    return train_py, source, knobs


def _candidates(
    lab_dir: Path,
    knobs: dict[str, Any],
    batch_sizes: Sequence[int] | None,
    compiles: Sequence[str] | None,
    attentions: Sequence[str] | None,
) -> tuple[list[Candidate], Candidate]:
    """Every combination to measure (the options checked), and the setting train.py has now among them."""
    from nightlab.harness.accel import ATTENTION_CHOICES, COMPILE_CHOICES, available_attention
    from nightlab.harness.profiles import load_lab_profile

    seq_len = load_lab_profile(lab_dir).seq_len
    total = int(knobs["TOTAL_BATCH_SIZE"])
    sizes = (
        list(batch_sizes)
        if batch_sizes
        else _default_batch_sizes(int(knobs["DEVICE_BATCH_SIZE"]), total, seq_len)
    )
    for b in sizes:
        if b < 1 or total % (b * seq_len):
            raise UsageError(
                f"batch size `{b}`: TOTAL_BATCH_SIZE {total} is not a multiple of {b} x seq_len {seq_len}"
            )
    compiles = list(compiles or ("on", "off"))
    attentions = list(attentions or available_attention())
    for value, choices, name in [(c, COMPILE_CHOICES, "compile") for c in compiles] + [
        (a, ATTENTION_CHOICES, "attention") for a in attentions
    ]:
        if value not in choices:
            raise UsageError(f"{name} `{value}` is not one of {', '.join(choices)}")
    candidates = [Candidate(c, a, b) for c in compiles for a in attentions for b in sizes]
    # the setting train.py has now is what a winner must beat: measured like the others
    present = Candidate(str(knobs["COMPILE"]), str(knobs["ATTENTION"]), int(knobs["DEVICE_BATCH_SIZE"]))
    if present not in candidates:
        candidates.insert(0, present)
    return candidates, present


def _measure(
    lab_dir: Path,
    source: str,
    candidates: list[Candidate],
    *,
    steps: int,
    timeout: float,
    repeats: int,
    progress: bool,
) -> list[TuneRow]:
    """One row per candidate: up to `repeats` runs of it, each a fresh process, in a copy of the lab."""
    rows: list[TuneRow] = []
    with tempfile.TemporaryDirectory(prefix="nightlab-tune-") as tmp:
        workdir = Path(tmp) / "lab"
        # The whole lab tree, since train.py may import its neighbours; not the git or nightlab state.
        shutil.copytree(lab_dir, workdir, ignore=shutil.ignore_patterns(".git", ".nightlab"))
        for i, candidate in enumerate(candidates, 1):
            if progress:
                print(
                    f"tune {i}/{len(candidates)}: compile={candidate.compile} attention={candidate.attention} "
                    f"DEVICE_BATCH_SIZE={candidate.device_batch_size} x {repeats} ...",
                    file=sys.stderr,
                    flush=True,
                )
            runs: list[TuneRow] = []
            for _ in range(repeats):
                runs.append(_run_candidate(workdir, source, candidate, steps, timeout))
                if runs[-1].status != "ok":
                    break  # a crash, an OOM or a hang does not get better by repeating
            rows.append(_repeat(runs))
    return rows


def tune(
    lab_dir: Path,
    *,
    steps: int = 30,
    batch_sizes: Sequence[int] | None = None,
    compiles: Sequence[str] | None = None,
    attentions: Sequence[str] | None = None,
    timeout: float = 900.0,
    write: bool = True,
    progress: bool = True,
    repeats: int = 3,
) -> TuneResult:
    """Run every candidate `repeats` times and write the fastest into train.py if it beats the current setting
    beyond the spread (module docstring).

    Args:
        lab_dir: the lab (holds train.py and nightlab.toml with a [profile]).
        steps: training steps per candidate; more than train.py's warmup steps (10 on CUDA).
        batch_sizes: DEVICE_BATCH_SIZE values; default half, same and double the current one
            (those that divide TOTAL_BATCH_SIZE / seq_len).
        compiles: COMPILE values; default "on" and "off".
        attentions: ATTENTION values; default every backend that works here (fa3 on Hopper, sdpa).
        timeout: seconds allowed per candidate (a hung compile counts as "timeout").
        write: whether to write the fastest choice into train.py.
        progress: whether to print progress and the table on stderr.
        repeats: runs per candidate (fresh processes); at least 2 for an interval.

    Returns:
        A `TuneResult`.

    Raises:
        UsageError: the lab has no train.py, train.py lacks a knob tune sets, or an option is bad.
        NightlabError: every candidate failed (nothing is written).
    """
    from nightlab.search.knobs import set_knobs

    lab_dir = Path(lab_dir)
    train_py, source, knobs = _read_train_py(lab_dir)
    if steps < 1:
        raise UsageError(f"steps `{steps}` must be at least 1 (and above the warmup steps, 10 on CUDA)")
    if repeats < 1:
        raise UsageError(f"repeats `{repeats}` must be at least 1 (2 or more give an interval)")
    candidates, present = _candidates(lab_dir, knobs, batch_sizes, compiles, attentions)
    rows = _measure(
        lab_dir, source, candidates, steps=steps, timeout=timeout, repeats=repeats, progress=progress
    )

    ok = [r for r in rows if r.status == "ok"]
    best = max(ok, key=lambda r: r.tok_per_sec or 0.0) if ok else None
    current = next(r for r in rows if r.candidate == present)
    if progress:
        _print_table(rows, best, current)
    if best is None:
        raise NightlabError(
            f"every tune candidate failed (first: {rows[0].status}: {rows[0].detail}); "
            "run `python train.py` in the lab to see why"
        )
    beats, reason = decide(best, current)
    if progress:
        print(f"tune: {reason}", file=sys.stderr)
    written = {
        # What actually ran: a compile that fell back to eager is written as "off".
        "COMPILE": repr("on" if best.compiled else "off"),
        "ATTENTION": repr(best.attention),
        "DEVICE_BATCH_SIZE": str(best.candidate.device_batch_size),
    }
    if write and beats:
        new = set_knobs(source, written)
        atomic_write_text(train_py, new)
    return TuneResult(rows, best, written if write and beats else {}, current, reason, beats)
