"""Sending experiments to a tracker: one `Sender` for live logging and `nightlab export` alike.

Live logging (`follow`) reads the ledger's outbox (`Ledger.tracker_pending`: the ends,
verdicts and adoptions past the destination's cursor), sends each experiment whose record
changed (`RunRecord.digest` against `tracker_runs`), then the incumbent's new points, then moves
the cursor. Nothing is lost: the cursor moves only after a batch is sent, so a controller that
restarts, a worker that is killed mid-send or a tracker that is down leaves the batch for the next
try, and a re-send of what a destination holds is skipped (or, after a crash between the send
and its record, updates the same run: run ids derive from the lab and experiment ids).

A failure of any kind (unreachable server, bad credentials, library missing or raising) is
recorded in the ledger (`tracker_failed`: `nightlab status` and `doctor` show it), logged once
when the outage begins and once when it ends, and retried with a capped exponential backoff.

Usage:
    sender = Sender(lab_dir, config, ledger, tracker)
    sender.send(["e0001", "e0002"]); sender.send_incumbent()
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from nightlab.config import LabConfig
from nightlab.errors import one_line
from nightlab.ledger import ExperimentStatus, Ledger, Verdict
from nightlab.trackers._base import BaseTracker
from nightlab.trackers._record import LabView, incumbent_points

log = logging.getLogger("nightlab.trackers")

BATCH = 50  # outbox events read per turn: a batch is sent before the cursor moves
RETRY_SECONDS = 5.0  # the first retry after a failure; doubled per failure up to RETRY_MAX_SECONDS
RETRY_MAX_SECONDS = 300.0
_MOVES_INCUMBENT = (Verdict.BASELINE, Verdict.KEEP)


def describe(error: BaseException) -> str:
    """A tracker's failure as one short line (MLflow and W&B errors can run to pages)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {one_line(lines[0][:300]) if lines else ''}".rstrip(": ")


def retry_delay(failures: int) -> float:
    return min(RETRY_MAX_SECONDS, RETRY_SECONDS * 2 ** max(0, failures - 1))


class Sender:
    """Sends experiments of one lab to one tracker and records what it holds in the ledger."""

    def __init__(self, lab_dir: Path, config: LabConfig, ledger: Ledger, tracker: BaseTracker) -> None:
        self.lab_dir, self.config, self.ledger, self.tracker = Path(lab_dir), config, ledger, tracker
        self.lab_id = ledger.lab_id()

    def send(self, ids: Iterable[str], *, progress: Callable[[str], None] | None = None) -> tuple[int, bool]:
        """Send the finished experiments of `ids` whose record the destination lacks.

        Returns (how many were sent, whether one of them can move the incumbent's line).
        Raises whatever the tracker raises; what was sent before stays recorded.
        """
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return 0, False
        view = LabView(self.lab_dir, self.config, self.ledger, self.lab_id)
        held = self.ledger.tracker_digests(self.tracker.key)
        sent, moves = 0, False
        for e in self.ledger.experiments(ids=wanted, status=ExperimentStatus.FINISHED):
            record = view.record(e)
            moves = moves or e.verdict in _MOVES_INCUMBENT or e.adopted_at is not None
            if held.get(e.id) == record.digest:
                continue
            run_id, url = self.tracker.log_run(record, view.wave(e.wave) if e.wave else None)
            self.ledger.tracker_sent(self.tracker.key, e.id, run_id=run_id, url=url, digest=record.digest)
            sent += 1
            if progress is not None:
                progress(e.id)
        return sent, moves

    def send_incumbent(self) -> int:
        """Append the incumbent's new points per tier; returns how many were sent."""
        state = self.ledger.tracker_state(self.tracker.key)
        done = dict(state.incumbent) if state else {}
        metric = self.config.metric
        lines = incumbent_points(
            self.ledger.experiments(status=ExperimentStatus.FINISHED),
            metric.name,
            lower_is_better=metric.lower_is_better,
        )
        sent = 0
        for tier, points in lines.items():
            fresh = [p for p in points if p[0] > done.get(tier, 0)]
            if fresh:
                self.tracker.log_incumbent(tier, metric.name, fresh, self.lab_id)
                done[tier] = fresh[-1][0]
                self.ledger.tracker_advance(self.tracker.key, incumbent=done)
                sent += len(fresh)
        return sent


def follow(
    lab_dir: Path,
    config: LabConfig,
    make_tracker: Callable[[], BaseTracker],
    key: str,
    stop: threading.Event,
    *,
    poll: float = 1.0,
) -> None:
    """Send every experiment that ends (or is re-judged, or adopted) until `stop` is set.

    `make_tracker` is called (again after a failure) until it gives a tracker: a missing library
    or a bad server is an outage like any other. Opens its own ledger connection (one per thread).
    """
    from nightlab.ledger import open_ledger

    with open_ledger(lab_dir) as ledger:
        tracker: BaseTracker | None = None
        while not stop.is_set():
            state = ledger.tracker_state(key)
            pending = ledger.tracker_pending(after=state.cursor if state else 0, limit=BATCH)
            if not pending and tracker is not None:
                stop.wait(poll)
                continue
            try:
                if tracker is None:
                    tracker = make_tracker()
                if not pending:
                    continue
                sender = Sender(lab_dir, config, ledger, tracker)
                sent, moves = sender.send(eid for _, eid in pending)
                if moves:
                    sender.send_incumbent()
                ledger.tracker_advance(key, cursor=pending[-1][0])
                if state is not None and state.failures:
                    log.info(
                        "%s is back: sent the runs queued since the outage (%d in this batch)", key, sent
                    )
            except Exception as e:  # noqa: BLE001 - any failure of a tracker is an outage, never the fleet's
                failed = ledger.tracker_failed(key, describe(e))
                if failed.failures == 1:
                    log.warning(
                        "%s: %s; finished runs are queued in the ledger and sent when it works "
                        "(`nightlab status` shows the backlog)",
                        key,
                        failed.error,
                    )
                stop.wait(retry_delay(failed.failures))
        if tracker is not None:
            tracker.close()
