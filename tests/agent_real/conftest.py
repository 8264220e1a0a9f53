"""Session fixtures of the real-CLI tests: the pinned CLIs (installed once) and the loopback net."""

from __future__ import annotations

import pytest
from real_support import CLIS, LoopbackNet, install_cli


@pytest.fixture(scope="session")
def bins():
    return {name: install_cli(name) for name in CLIS}


@pytest.fixture(scope="session")
def net(watchdog):
    loopback = LoopbackNet(watchdog)
    yield loopback
    loopback.close()
