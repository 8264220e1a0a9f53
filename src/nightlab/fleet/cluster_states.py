"""The words of a remote worker's cluster: its state machine's states and the events it records.

A leaf (stdlib only): `fleet/skypilot/clusters.py` runs the state machine and records the events,
`fleet/costs.py` (which `nightlab report` imports without SkyPilot) reads them back, and both
import their words from here. The event kinds are stored in the ledger (`events.kind`), so their
values never change.
"""

from __future__ import annotations

import enum


class ClusterState(enum.StrEnum):
    """Where a worker's cluster is in its state machine (`fleet/skypilot/clusters.py`); `fleet up` prints these words."""

    UNKNOWN = "unknown"  # not asked yet
    CHECKING = "checking"  # one `sky.status` for all is in flight
    DOWN = "down"  # not there (never launched, stopped, preempted): launched when work needs it
    LAUNCHING = "launching"  # `sky.launch`, set-up and the probe are in flight
    UP = "up"
    FAILED = "failed"  # its launch failed: retried after `retry_at` (never, for set-up failures)


class ClusterEvent(enum.StrEnum):
    """The ledger event the SkyPilot backend records at each change of a worker's cluster."""

    LAUNCH = "cluster-launch"  # `sky.launch` started
    UP = "cluster-up"  # set up and probed: its hourly price, GPU, set-up seconds, slots, software
    FAILED = "cluster-failed"  # its launch or set-up failed (`provisioned`: a live cluster bills on)
    LOST = "cluster-lost"  # it was up and is gone (preempted, its allocation ended)
    DOWN = "cluster-down"  # torn down (`nightlab fleet down`)


CLUSTER_EVENTS = tuple(ClusterEvent)


class BillingState(enum.StrEnum):
    """A worker's cluster as its latest `ClusterEvent` leaves it, in `fleet status` and the cost report.

    The state machine's words (`ClusterState`) where they mean the same; `lost` and `autostopped`
    are `ClusterState.DOWN` to the machine, told apart here because they bill differently.
    """

    LAUNCHING = ClusterState.LAUNCHING.value
    UP = ClusterState.UP.value
    FAILED = ClusterState.FAILED.value
    DOWN = ClusterState.DOWN.value
    LOST = "lost"
    AUTOSTOPPED = "autostopped"  # held with no controller watching: SkyPilot stopped it by now

    @classmethod
    def after(cls, event: ClusterEvent) -> BillingState:
        """What the cluster is after `event`."""
        return _AFTER[event]


_AFTER = {
    ClusterEvent.LAUNCH: BillingState.LAUNCHING,
    ClusterEvent.UP: BillingState.UP,
    ClusterEvent.FAILED: BillingState.FAILED,
    ClusterEvent.LOST: BillingState.LOST,
    ClusterEvent.DOWN: BillingState.DOWN,
}
