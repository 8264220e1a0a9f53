"""The agent page's data: whatever the supervisor left under `.nightlab/agent/`.

The supervisor (`nightlab.agent`) owns that directory and its format; the dashboard only
reads it, defensively: a JSON state file (`state.json`, else the newest `*.json`) and
the tail of the newest transcript (`transcript*`, `*.log`, `*.jsonl`, `*.txt`). Missing,
half-written or unexpected files never break the page: they show as "no agent".
Whether the agent is alive is read from the state's `pid` (signal 0 only probes).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from nightlab.fleet.runner import read_tail

TRANSCRIPT_LINES = 200
LINE_CHARS = 2000
_TRANSCRIPT_SUFFIXES = (".log", ".jsonl", ".txt", ".md")


def _newest(paths: list[Path]) -> Path | None:
    def mtime(p: Path) -> float:
        try:
            return p.stat().st_mtime
        except OSError:
            return 0.0

    return max(paths, key=mtime, default=None)


def _pid_alive(pid: Any) -> bool | None:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    except OSError:
        return None
    return True


def agent_state(lab_dir: Path) -> dict[str, Any]:
    """The supervisor's state and transcript tail; `present` is False when no agent ever ran."""
    root = lab_dir / ".nightlab" / "agent"
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
    state_file = root / "state.json" if (root / "state.json").is_file() else None
    state_file = state_file or _newest([p for p in files if p.suffix == ".json"])
    state: dict[str, Any] | None = None
    state_error = None
    if state_file is not None:
        try:
            loaded = json.loads(state_file.read_text(encoding="utf-8", errors="replace"))
            state = loaded if isinstance(loaded, dict) else {"value": loaded}
        except (OSError, ValueError) as e:
            state_error = f"{state_file.name}: {e}"
    transcript = _newest(
        [p for p in files if p.name.startswith("transcript") or p.suffix in _TRANSCRIPT_SUFFIXES]
    )
    lines: list[str] = []
    if transcript is not None:
        text = read_tail(transcript, 256 * 1024).replace("\r\n", "\n").replace("\r", "\n")
        lines = (
            [line[:LINE_CHARS] for line in text.rstrip().split("\n")][-TRANSCRIPT_LINES:]
            if text.strip()
            else []
        )
    pid = state.get("pid") if state else None
    alive = _pid_alive(pid)
    return {
        "present": bool(state is not None or transcript is not None or state_error),
        "running": bool(alive) if alive is not None else bool(state and state.get("state") == "running"),
        "pid": pid,
        "pid_alive": alive,
        "state": state,
        "state_file": str(state_file.relative_to(lab_dir)) if state_file else None,
        "state_error": state_error,
        "transcript_file": str(transcript.relative_to(lab_dir)) if transcript else None,
        "transcript_tail": lines,
    }
