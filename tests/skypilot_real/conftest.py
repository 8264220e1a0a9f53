"""The real SkyPilot on a real local Slurm cluster, once per test session (see localsky.py).

The fixture fails, never skips, when the cluster cannot start: CI must not pass without
having run these tests. Everything it starts is stopped by PID at the end of the session,
also after a failed test or a failed start.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from localsky import LocalSky  # noqa: E402


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
