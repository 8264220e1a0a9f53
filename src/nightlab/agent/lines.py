"""The one-line views of a supervisor's state: `nightlab agent status` and the dashboard show these.

Written once here so the two never drift; times read as `display.clock`.
"""

from __future__ import annotations

import time
from typing import Any

from nightlab.display import clock


def outage_line(state: dict[str, Any], *, now: float | None = None) -> str | None:
    """ "API unavailable since …, next try at …" while the model API is down, else None."""
    api = state.get("api")
    if not api:
        return None
    now = time.time() if now is None else now
    next_try = api["next_try_at"]
    when = f"in {next_try - now:.0f} s" if next_try > now else "now"
    failures = api["failures"]
    return (
        f"API unavailable since {clock(api['since'])} ({now - api['since']:.0f} s), next try at "
        f"{clock(next_try)} ({when}); {failures} failed session{'s' if failures != 1 else ''}, "
        f"last error: {api.get('last_error') or '-'}"
    )


def cost_line(state: dict[str, Any]) -> str:
    """API cost of the run, of the last session and the cap, next to the fleet's GPU cost."""
    sessions = state.get("sessions") or []
    parts = [f"API ${state.get('cost_usd') or 0.0:.2f} this run"]
    last = sessions[-1].get("cost_usd") if sessions else None
    if last is not None:
        parts.append(f"${last:.2f} last session")
    cap = (state.get("limits") or {}).get("max_cost")
    if cap is not None:
        parts.append(f"cap ${cap:.2f}")
    gpu = state.get("gpu_cost_usd")
    parts.append(f"GPU {'-' if gpu is None else f'${gpu:.2f}'} (fleet)")
    return ", ".join(parts)


def session_line(session: dict[str, Any]) -> str:
    """One finished session from its transcript: how it ended, what it did and cost, its last words."""
    cost = session.get("cost_usd")
    line = (
        f"session {session['n']}: {session['end']} after {session['ended_at'] - session['started_at']:.0f} s, "
        f"{session.get('turns', 0)} turns, {session.get('commands', 0)} commands"
        + ("" if cost is None else f", ${cost:.2f}")
    )
    said = session.get("error") or session.get("last_message")
    return line + (f"; {said}" if said else "")
