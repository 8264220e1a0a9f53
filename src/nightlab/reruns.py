"""Following a degraded run to its re-run: what a waiter needs after the controller's second step.

The controller ends a degraded run (recorded, never judged), then queues its one re-run in a
second transaction (`fleet/health.py`, event `rerun` with `of`), or, for a re-run that ended
degraded too, logs `degraded-again` and queues nothing. A waiter that saw a run end degraded asks
`Reruns.of` for the re-run to wait for next. `nightlab demo` and `nightlab search` use it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

__all__ = ["RERUN_DECISION_WAIT", "Reruns"]

# How long a waiter waits for the controller's second step before it stops following the run
# (the controller stopped between the two steps).
RERUN_DECISION_WAIT = 10.0


class Reruns:
    """Follows the controller's second step after a degraded run: its one re-run, or none for a re-run."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger
        self.after = 0  # the last event read
        self.decided: dict[str, str | None] = {}  # degraded id -> its re-run's id (None: no re-run)

    def of(self, finished: Sequence[Any], *, timeout: float = RERUN_DECISION_WAIT) -> list[str]:
        """The re-runs queued for the degraded runs among `finished` that are not followed yet."""
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
