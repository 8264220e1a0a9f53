"""The real SkyPilot on a real local Slurm cluster, once per test session (see localsky.py).

Runs in `make test`. With `CI` set the fixture fails, never skips, when the cluster cannot
start or the machine lacks what it needs (`.ci/run` installs the Debian packages, `make
install` the pinned `skypilot[slurm]` extra). Elsewhere the tests skip only when the machine
lacks something the fixture cannot install itself, with a one-line reason naming it
(`localsky.missing`); a cluster that fails to start fails them there too. Everything the
fixture starts is stopped by PID at the end of the session, also after a failed test or a
failed start, and when the run is stopped: SIGTERM runs the finalizer like Ctrl-C, and if pytest
dies without it (SIGKILL) the session's watchdog reaps the run (tests/services.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from localsky import LocalSky, missing  # noqa: E402


@pytest.fixture(scope="session")
def local_sky(watchdog):
    """A running LocalSky: `local_sky.environ()` is the environment to run nightlab and sky in."""
    lacking = missing()
    if lacking is not None:
        message = f"the local Slurm + SkyPilot cluster needs {lacking}"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    local = LocalSky(watchdog=watchdog)
    try:
        local.up()
    except Exception as e:
        pytest.fail(f"the local Slurm + SkyPilot cluster did not start: {e}", pytrace=False)
    try:
        yield local
    finally:
        local.down()
