"""What a lab's files prove about its experiments, apart from the ledger.

Two traces outlive a lost or restored ledger: the snapshot ref of every submitted experiment
(`refs/nightlab/<id>`, made in the submit's transaction) and the run folder of every attempt
that started (`.nightlab/runs/<id>/attempt-<n>/`: `log.txt`, the `exit` status the local
runner writes last, the harness's `score.json`). The id allocator skips every id they hold
(`highest_seq`), so a submit after a restore never overwrites an older snapshot's ref or
appends to an older run's log, and `nightlab.restore` rebuilds what they still prove.

    floor = highest_seq(lab_dir)          # ids up to e{floor:04d} are taken
    runs = run_folders(lab_dir)           # {"e0007": [AttemptTrace(1, exit_code=0, ...)]}

stdlib only (and git).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

_ID = re.compile(r"^e(\d{4,})$")
_ATTEMPT = re.compile(r"^attempt-(\d+)$")


def seq_of(experiment_id: str) -> int | None:
    """The sequence number of an experiment id (`e0007` -> 7), None for anything else."""
    match = _ID.match(experiment_id)
    return int(match.group(1)) if match else None


def refs(lab_dir: Path) -> dict[str, str] | None:
    """Every snapshot ref of the lab, id -> commit (None when git cannot answer)."""
    proc = subprocess.run(
        ["git", "for-each-ref", "--format=%(refname:lstrip=2) %(objectname)", "refs/nightlab/"],
        cwd=lab_dir,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        return None
    return dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)


@dataclass(frozen=True)
class AttemptTrace:
    """One attempt folder: its number, and the exit status the runner wrote when it ended (None: it did not)."""

    number: int
    folder: Path
    exit_code: int | None
    ended_at: float | None  # when the exit status was written
    started_at: float | None  # when the run script was written


def run_folders(lab_dir: Path) -> dict[str, list[AttemptTrace]]:
    """The attempt folders under `.nightlab/runs/`, by experiment id, each list in attempt order."""
    root = Path(lab_dir) / ".nightlab" / "runs"
    found: dict[str, list[AttemptTrace]] = {}
    if not root.is_dir():
        return found
    for folder in root.iterdir():
        if seq_of(folder.name) is None or not folder.is_dir():
            continue
        traces = []
        for sub in folder.iterdir():
            match = _ATTEMPT.match(sub.name)
            if match and sub.is_dir():
                traces.append(_trace(int(match.group(1)), sub))
        found[folder.name] = sorted(traces, key=lambda t: t.number)
    return found


def _trace(number: int, folder: Path) -> AttemptTrace:
    exit_file, script = folder / "exit", folder / "run.sh"
    try:
        code: int | None = int(exit_file.read_text().strip())
        ended: float | None = exit_file.stat().st_mtime
    except (OSError, ValueError):
        code, ended = None, None
    try:
        started: float | None = script.stat().st_mtime
    except OSError:
        started = None
    return AttemptTrace(number, folder, code, ended, started)


def highest_seq(lab_dir: Path) -> int:
    """The highest id sequence number a snapshot ref or a run folder holds (0 when none)."""
    ids = set(refs(lab_dir) or {})
    root = Path(lab_dir) / ".nightlab" / "runs"
    if root.is_dir():
        ids.update(entry.name for entry in root.iterdir())
    return max((s for s in map(seq_of, ids) if s is not None), default=0)
