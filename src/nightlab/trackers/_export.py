"""`nightlab export wandb|mlflow` and the trackers' lines in `nightlab status` and `doctor`.

An export sends every finished experiment of the lab (or those of `--wave`, or from `--since`
on) through the same `Sender` as live logging, so it makes the runs live logging would have
made: a run a destination already holds in the same state is skipped, one that changed since
(a verdict re-judged, an adoption) is updated, and nothing is ever duplicated.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from nightlab.errors import NightlabError, UsageError
from nightlab.ledger import BaseLedger, Experiment, ExperimentStatus
from nightlab.trackers._base import TRACKERS, make_tracker
from nightlab.trackers._outbox import Sender, describe


def _since(exps: list[Experiment], since: str) -> list[Experiment]:
    """Experiments from id `eNNNN` on, or finished at or after an ISO date / time (local)."""
    if since[:1] == "e" and since[1:].isdigit():
        return [e for e in exps if e.seq >= int(since[1:])]
    try:
        start = datetime.fromisoformat(since).timestamp()
    except ValueError:
        raise UsageError(
            f"`--since {since}` is neither an experiment id (`e0042`) nor a date (`2026-12-01` or "
            "`2026-12-01T22:00`)"
        ) from None
    return [e for e in exps if (e.finished_at or 0) >= start]


def export(
    lab: Any,
    name: str,
    *,
    since: str | None = None,
    wave: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Send a lab's finished experiments to tracker `name`; returns what was done.

    Raises:
        UsageError: the tracker is not configured or not installed, or `since` / `wave` is bad.
        NightlabError: the tracker failed (what was sent before stays sent: export again).
    """
    if wave is not None:
        lab.ledger.wave(wave)  # an unknown wave fails with its name
    exps = lab.ledger.experiments(status=ExperimentStatus.FINISHED, wave=wave, with_metrics=False)
    if since is not None:
        exps = _since(exps, since)
    tracker = make_tracker(name, lab.config, lab.path)
    started = time.time()
    try:
        sender = Sender(lab.path, lab.config, lab.ledger, tracker)
        sent, _ = sender.send((e.id for e in exps), progress=progress)
        points = sender.send_incumbent()
    except NightlabError:
        raise
    except Exception as e:  # noqa: BLE001 - the library's own errors, as one line
        raise NightlabError(
            f"{name} ({tracker.key}) failed: {describe(e)}; what was sent stays sent: run the export again"
        ) from e
    finally:
        tracker.close()
    return {
        "tracker": name,
        "destination": tracker.key,
        "experiments": len(exps),
        "sent": sent,
        "unchanged": len(exps) - sent,
        "incumbent_points": points,
        "seconds": round(time.time() - started, 3),
    }


def tracker_status(config: Any, ledger: BaseLedger) -> list[dict[str, Any]]:
    """Each configured tracker: destination, runs sent, runs queued, the current outage, if any."""
    out = []
    for name in TRACKERS:
        section = getattr(config.trackers, name)
        if section is None:
            continue
        state = ledger.tracker_state(section.key)
        out.append(
            {
                "tracker": name,
                "destination": section.key,
                "installed": importlib.util.find_spec(name) is not None,
                "sent": ledger.tracker_sent_count(section.key),
                "queued": ledger.tracker_backlog(section.key),
                "error": state.error if state else None,
                "failing_since": state.failing_since if state else None,
                "failures": state.failures if state else 0,
            }
        )
    return out
