"""The real SkyPilot on a real local Slurm cluster, once per test session (see localsky.py).

The fixture fails, never skips, when the cluster cannot start. Everything it starts is stopped by
PID at the end of the session, also after a failed test or a failed start.

Opt-in for now (`NIGHTLAB_REAL_SKY=1 pytest -q tests/skypilot_real`): on the shared 2-core box
(load 15-33 from other sessions) one run takes 13-15 minutes, over the 10-minute goal and the CI
budget, and it has not yet passed twice in a row (bench/RESULTS.md has each run and what it
found); issue 14 stays open until it runs in `make test`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from localsky import LocalSky  # noqa: E402

if os.environ.get("NIGHTLAB_REAL_SKY") != "1":
    collect_ignore = ["test_fleet_on_slurm.py"]


@pytest.fixture(scope="session")
def local_sky():
    """A running LocalSky: `local_sky.environ()` is the environment to run nightlab and sky in."""
    local = LocalSky()
    try:
        local.up()
    except Exception as e:
        pytest.fail(f"the local Slurm + SkyPilot cluster did not start: {e}", pytrace=False)
    try:
        yield local
    finally:
        local.down()
