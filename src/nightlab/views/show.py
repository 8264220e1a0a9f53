"""The `nightlab show --json` document: one experiment (the dashboard's experiment page too)."""

from __future__ import annotations

from typing import Any

TAIL_LINES = 30  # log lines `nightlab show` prints by default


def show_payload(
    lab: Any, experiment_id: str, *, tail_lines: int = TAIL_LINES, diff: bool = True
) -> dict[str, Any]:
    """One experiment as `nightlab show --json` prints it (the dashboard shows the same)."""
    from pathlib import Path

    from nightlab import snapshots
    from nightlab.errors import SnapshotError
    from nightlab.fleet.runner import clean_lines, read_tail

    e = lab.ledger.get(experiment_id)
    attempts = lab.ledger.attempts(e.id)
    log_path = next((a.log_path for a in reversed(attempts) if a.log_path), None)
    # `--tail 0` is no log at all (a slice `[-0:]` would be the whole log)
    tail = clean_lines(read_tail(Path(log_path)))[-tail_lines:] if log_path and tail_lines > 0 else []
    while tail and not tail[-1].strip():
        tail.pop()
    try:
        text = snapshots.diff(lab.path, e.parent, e.snapshot) if diff else ""
    except SnapshotError as err:
        text = f"(diff unavailable: {err})"
    from nightlab.judge import trust

    data = e.to_dict()
    data["trust"] = trust(e, lab.config)
    # a degraded run is re-run once (fleet/health.py): the one figure that counts is the re-run's
    data["rerun_of"], data["rerun"] = lab.ledger.rerun_links(e.id)
    # why the verdict, and the next step: what `nightlab results` prints below its table
    from nightlab.judge import Judge

    data["reason"], data["next_step"] = Judge(lab.ledger, lab.config, lab.path).explain(e)
    data.update(attempts=[a.to_dict() for a in attempts], diff=text, log_tail=tail, log_path=log_path)
    # a finished run's log deleted by hand (or with its run folder) reads as missing, not as a
    # silent empty tail; a remote run's log may not exist yet while it runs
    data["log_missing"] = e.status.is_finished() and bool(log_path) and not Path(log_path).is_file()
    # its run in each experiment tracker it was sent to (`url` None where the run has no web page yet)
    data["trackers"] = [r.to_dict() for r in lab.ledger.tracker_runs(e.id)]
    from nightlab.rungs import rung_info

    # its budget, the rung it reached and why it was or was not promoted (`nightlab.rungs`)
    data["rung"] = rung_info(lab, e)
    return data
