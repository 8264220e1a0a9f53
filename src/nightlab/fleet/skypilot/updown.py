"""`nightlab fleet up` / `fleet down`: the SkyPilot clusters of a lab, outside the controller.

The caller's thread opens the lab's ledger and hands it to the backend, which records
the clusters' events there as they come (`core.Shared`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nightlab.errors import UsageError
from nightlab.fleet.skypilot.backend import SkyPilotBackend


def _run(lab_dir: Path, sdk: Any, body: Any) -> Any:
    from nightlab.config import load_lab_config
    from nightlab.ledger import open_ledger

    config = load_lab_config(lab_dir).config
    if not any(p.backend == "skypilot" for p in config.fleet.pools):
        raise UsageError(
            'nightlab.toml has no [[fleet.pool]] with `backend = "skypilot"`; add one (see docs/skypilot.md)'
        )
    with open_ledger(lab_dir) as ledger:
        backend = SkyPilotBackend(config, lab_dir=lab_dir, ledger=ledger, sdk=sdk)
        try:
            return body(backend)
        finally:
            backend.close()


def fleet_up(
    lab_dir: Path, *, relaunch: bool = False, sdk: Any = None, on_change: Any = None
) -> list[dict[str, Any]]:
    """Launch and set up one cluster per skypilot worker of the lab; waits for all of them.

    Args:
        relaunch: launch clusters that are already up again (reruns their set-up).
        sdk: the SDK to call (the `sky` module by default).
        on_change: called with (worker, state, detail) as clusters change.

    Returns:
        One dict per worker (worker, cluster, state, detail, gpu_name, hourly_price).

    Raises:
        UsageError: the lab has no skypilot pool, SkyPilot is not installed, or fleet/skypilot.yaml
            is not a task nightlab can run (checked before any launch).
    """
    from nightlab.fleet.sky_task import load_worker_config

    load_worker_config(lab_dir)  # a bad worker YAML is the user's to fix: exit 2, not N failed launches
    return _run(lab_dir, sdk, lambda backend: backend.up(relaunch=relaunch, on_change=on_change))


def fleet_down(lab_dir: Path, *, sdk: Any = None) -> list[str]:
    """Tear down every SkyPilot cluster of the lab; returns the names torn down.

    Raises:
        NightlabError: some clusters could not be torn down (named, with the fix).
    """
    return _run(lab_dir, sdk, lambda backend: backend.down())
