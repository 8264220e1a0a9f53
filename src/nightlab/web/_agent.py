"""The agent page's data: the supervisor's state and the tail of the agent's transcript.

The state is `nightlab agent status --json` (`agent.control.status`): `state.json` as the
supervisor last wrote it, plus whether the supervisor and its agent are alive now. The
transcript is the one the state names (the current or last session), else the newest
`transcript-*.log`. A lab where no agent ever ran has no `.nightlab/agent/`; then nothing is
probed (the liveness probe would create that directory and its lock file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nightlab.fleet.runner import clean_lines, read_tail

TRANSCRIPT_LINES = 200
LINE_CHARS = 2000
SESSIONS = 5  # the last sessions listed, newest last


def _transcript(agent_dir: Path, state: dict[str, Any]) -> Path | None:
    named = state.get("transcript")
    if isinstance(named, str) and Path(named).is_file():
        return Path(named)
    logs = [p for p in agent_dir.glob("transcript*") if p.is_file()]
    return max(logs, key=lambda p: p.stat().st_mtime, default=None)


def agent_state(lab_dir: Path) -> dict[str, Any]:
    """`present` (an agent ran here), `status` (= `nightlab agent status --json`), the transcript tail,
    and the `outage`, `cost` and last `sessions` lines of `nightlab agent status`."""
    from nightlab.agent import control, lines
    from nightlab.errors import NightlabError

    agent_dir = control.agent_dir(lab_dir)
    out: dict[str, Any] = {
        "present": False,
        "status": None,
        "error": None,
        "transcript_file": None,
        "transcript_tail": [],
        "outage": None,
        "cost": None,
        "sessions": [],
    }
    if not agent_dir.is_dir():
        return out
    try:
        status = control.status(lab_dir, import_old=False)  # the dashboard changes nothing
    except NightlabError as e:  # a state.json someone else broke
        out.update(present=True, error=str(e))
        return out
    out.update(present="pid" in status, status=status)
    if "pid" in status:  # the lines `nightlab agent status` prints, written once in agent/lines.py
        out["outage"] = lines.outage_line(status)
        out["cost"] = lines.cost_line(status)
        out["sessions"] = [lines.session_line(s) for s in (status.get("sessions") or [])[-SESSIONS:]]
    transcript = _transcript(agent_dir, status)
    if transcript is not None:
        out["present"] = True
        lines = clean_lines(read_tail(transcript, 256 * 1024))
        while lines and not lines[-1].strip():
            lines.pop()
        out["transcript_file"] = (
            str(transcript.relative_to(lab_dir)) if transcript.is_relative_to(lab_dir) else str(transcript)
        )
        out["transcript_tail"] = [line[:LINE_CHARS] for line in lines[-TRANSCRIPT_LINES:]]
    return out
