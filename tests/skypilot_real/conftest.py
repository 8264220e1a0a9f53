"""The real SkyPilot on a real local Slurm cluster, once per test session (see localsky.py).

Runs in `make test`. When the machine lacks something the fixture cannot install itself
(`localsky.missing`), the run says so before the first test and the tests skip, or fail with
`CI` set (tests/needs.py; `.ci/install-test-deps` installs the Debian packages, `make install`
the pinned `skypilot[slurm]` extra); a cluster that fails to start fails them everywhere. Everything the
fixture starts is stopped by PID at the end of the session, also after a failed test or a
failed start, and when the run is stopped: SIGTERM runs the finalizer like Ctrl-C, and if pytest
dies without it (SIGKILL) the session's watchdog reaps the run (tests/services.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from localsky import LocalSky  # noqa: E402


@pytest.fixture(scope="session")
def local_sky(watchdog):
    """A running LocalSky: `local_sky.environ()` is the environment to run nightlab and sky in."""
    local = LocalSky(watchdog=watchdog)
    try:
        local.up()
    except Exception as e:
        pytest.fail(f"the local Slurm + SkyPilot cluster did not start: {e}", pytrace=False)
    try:
        yield local
    finally:
        local.down()
