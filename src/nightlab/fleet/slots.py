"""The worker slots of a lab's pools, and one backend object per kind of pool.

Usage: `slots, backends = build_slots(config, lab_dir=lab_dir)`; the controller leases to
the slots and hands each backend its ledger (`BaseBackend.use_ledger`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from nightlab.config import LabConfig, PoolConfig, pool_slots
from nightlab.errors import NightlabError
from nightlab.fleet.backend import BaseBackend, WorkerSlot
from nightlab.fleet.local import LocalBackend, local_slots
from nightlab.ledger import Worker, WorkerState


def _slots_of(pool: PoolConfig, *, cpu_slots: int | None = None) -> list[WorkerSlot]:
    """The worker slots of one pool."""
    if pool.backend == "local":
        return local_slots(pool, cpu_slots=cpu_slots)
    if pool.backend == "skypilot":
        from nightlab.fleet.skypilot import skypilot_slots

        return skypilot_slots(pool)
    raise NightlabError(f"unknown backend `{pool.backend}`")  # `nightlab.config` already refuses other names


def build_slots(
    config: LabConfig, *, cpu_slots: int | None = None, lab_dir: Path | None = None
) -> tuple[list[WorkerSlot], dict[str, BaseBackend]]:
    """The worker slots of every pool in the config, and one backend object per kind."""
    slots: list[WorkerSlot] = []
    backends: dict[str, BaseBackend] = {}
    for pool in config.fleet.pools:
        slots += _slots_of(pool, cpu_slots=cpu_slots)
        if pool.backend == "local":
            backends.setdefault("local", LocalBackend())
        elif "skypilot" not in backends:
            from nightlab.fleet.skypilot import SkyPilotBackend

            backends["skypilot"] = SkyPilotBackend(config, lab_dir=lab_dir)
    return slots, backends


def tier_slot_count(config: LabConfig, tier: str, workers: Sequence[Worker] = ()) -> int:
    """How many experiments the pools of `tier` run at once.

    The running controller's registered slots of the tier when it has any (they follow its
    `--cpu-slots`), else the slots the config gives.
    """
    live = [w for w in workers if w.tier == tier and w.state != WorkerState.STOPPED]
    if live:
        return len(live)
    return sum(pool_slots(p) for p in config.fleet.pools if p.tier == tier)
