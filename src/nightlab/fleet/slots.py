"""The worker slots of a lab's pools, and one backend object per kind of pool.

Usage: `slots, backends = build_slots(config, lab_dir=lab_dir)`; the controller leases to
the slots and hands each backend its ledger (`BaseBackend.use_ledger`).
"""

from __future__ import annotations

from pathlib import Path

from nightlab.config import LabConfig
from nightlab.errors import NightlabError
from nightlab.fleet.backend import BaseBackend, WorkerSlot
from nightlab.fleet.local import LocalBackend, local_slots


def build_slots(
    config: LabConfig, *, cpu_slots: int | None = None, lab_dir: Path | None = None
) -> tuple[list[WorkerSlot], dict[str, BaseBackend]]:
    """The worker slots of every pool in the config, and one backend object per kind."""
    slots: list[WorkerSlot] = []
    backends: dict[str, BaseBackend] = {}
    for pool in config.fleet.pools:
        if pool.backend == "local":
            backends.setdefault("local", LocalBackend())
            slots += local_slots(pool, cpu_slots=cpu_slots)
        elif pool.backend == "skypilot":
            from nightlab.fleet.skypilot import SkyPilotBackend, skypilot_slots

            if "skypilot" not in backends:
                backends["skypilot"] = SkyPilotBackend(config, lab_dir=lab_dir)
            slots += skypilot_slots(pool)
        else:  # config.py already refuses other names
            raise NightlabError(f"unknown backend `{pool.backend}`")
    return slots, backends
