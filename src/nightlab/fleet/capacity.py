"""Whether a lab's local slots fit this machine: CPU threads within the usable cores, one slot per GPU.

Refused before anything runs (`nightlab init`, `submit`, `fleet start`, a reloaded nightlab.toml),
unless `[fleet] oversubscribe = true`: slots that compete for cores end `degraded`
(`fleet/health.py`). stdlib only.
"""

from __future__ import annotations

import os
from typing import Any


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask; a container's or taskset's share)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


# The override, as nightlab.toml spells it and as `nightlab init` does.
TOML_OVERRIDE = "set `oversubscribe = true` under [fleet]"
INIT_OVERRIDE = "pass `--oversubscribe`"


def capacity_problem(slots: list[Any], *, cores: int | None = None, init: bool = False) -> str | None:
    """Why the local slots would compete for this machine, or None when they fit.

    CPU slots: their threads together must fit in the usable cores. GPU slots: no GPU index
    may serve two slots. The line names the fix and the override: `nightlab init`'s flags when
    `init`, else the keys of nightlab.toml.
    """
    cores = cores or usable_cores()
    local = [s for s in slots if s.backend == "local"]
    cpu = [s for s in local if "gpu" not in s.info]
    threads = sum(int(s.info.get("threads") or 1) for s in cpu)
    override = INIT_OVERRIDE if init else TOML_OVERRIDE
    fix = f"or {override} to accept that runs compete (most end `degraded`)"
    if threads > cores:
        by_tier: dict[str, list[int]] = {}
        for s in cpu:
            by_tier.setdefault(s.tier, []).append(int(s.info.get("threads") or 1))
        detail = ", ".join(f"{t}: {len(v)} x {v[0]}" for t, v in by_tier.items())
        lower = (
            f"pass `--cpu-slots {cores}` or fewer"
            if init
            else "lower `slots` or `threads` of the [[fleet.pool]] tables in nightlab.toml"
        )
        return (
            f"the local CPU slots ask for {threads} threads but this machine lets nightlab use {cores} cores "
            f"({detail}); {lower}, {fix}"
        )
    users: dict[int, list[str]] = {}
    for s in local:
        if "gpu" in s.info:
            users.setdefault(int(s.info["gpu"]), []).append(s.name)
    shared = {g: names for g, names in users.items() if len(names) > 1}
    if shared:
        g, names = next(iter(shared.items()))
        return (
            f"GPU {g} is used by {len(names)} slots ({', '.join(names)}); give each [[fleet.pool]] its own "
            f"`gpus`, {fix}"
        )
    return None


def check_capacity(config: Any, *, cpu_slots: int | None = None, init: bool = False) -> None:
    """Refuse a fleet whose local slots oversubscribe this machine, unless `[fleet] oversubscribe`.

    `init`: the lab is being created, so the fix names `nightlab init`'s flags.

    Raises:
        UsageError: the one line of `capacity_problem`.
    """
    from nightlab.errors import UsageError
    from nightlab.fleet.local import local_slots

    if config.fleet.oversubscribe:
        return
    slots = [
        s for p in config.fleet.pools if p.backend == "local" for s in local_slots(p, cpu_slots=cpu_slots)
    ]
    problem = capacity_problem(slots, init=init)
    if problem:
        raise UsageError(problem)
