"""Following a degraded run to its one re-run: what `nightlab wait` and the demo wait for too.

A run whose machine starved or throttled it ends `degraded` (fleet/health.py) and says nothing
about its idea; the controller then, in a second step after recording that end, queues its one
re-run (event `rerun`, data `of`), or logs `degraded-again` when the run was itself a re-run.
Whoever waits for a result (`wait`, the demo, `nightlab search`) must wait for that re-run too, or it stops at a run that was never
judged while the figure that counts is still queued.

Usage:
    follow = Reruns(lab.ledger)
    more = follow.of(finished)   # the re-runs queued for the degraded runs among `finished`
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

__all__ = ["RERUN_DECISION_WAIT", "Reruns"]

# The controller ends a degraded run, then queues its one re-run in a second step: how long a
# waiter waits for that step before it stops following the run (a controller that died in between).
RERUN_DECISION_WAIT = 10.0


class Reruns:
    """Follows the controller's second step after a degraded run: its one re-run, or none for a re-run."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger
        self.after = 0  # the last event read
        self.decided: dict[str, str | None] = {}  # degraded id -> its re-run's id (None: no re-run)

    def of(self, finished: Sequence[Any], *, timeout: float = RERUN_DECISION_WAIT) -> list[str]:
        """The re-runs queued for the degraded runs among `finished` that are not followed yet.

        Waits up to `timeout` s for the controller to decide about each of them.
        """
        pending = {e.id for e in finished if e.degraded and e.id not in self.decided}
        wanted = set(pending)
        deadline = time.time() + timeout
        while pending:
            while events := self.ledger.events(after=self.after, kinds=["rerun", "degraded-again"]):
                for ev in events:
                    self.after = ev.id
                    if ev.kind == "rerun":
                        self.decided[ev.data.get("of")] = ev.experiment_id
                    else:
                        self.decided[ev.experiment_id] = None
            pending -= self.decided.keys()
            if not pending or time.time() >= deadline:
                break
            time.sleep(0.2)
        return [self.decided[i] for i in sorted(wanted - pending) if self.decided[i] is not None]
