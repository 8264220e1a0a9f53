"""How `make test TEST_WORKERS=2` hands files to pytest-xdist workers (a pytest plugin, loaded by conftest.py).

`--dist loadfile` gives each worker whole files, so a file's module fixtures are built once. Some
folders share a session fixture too costly to start twice: the real Slurm cluster and SkyPilot API
server of tests/skypilot_real (~100 s to start, ~1 GiB), which two workers would each bring up side
by side on a 2-core machine. Each `ONE_WORKER` folder is therefore one unit of work: its files run
on one worker, one after the other, sharing that session.
"""

from __future__ import annotations

from typing import Any

import pytest

ONE_WORKER = ("tests/skypilot_real/",)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile`, with each `ONE_WORKER` folder one unit of work instead of one per file."""
    from xdist.scheduler import LoadFileScheduling

    class FilesAndFolders(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            folder = next((f for f in ONE_WORKER if nodeid.startswith(f)), None)
            return folder or super()._split_scope(nodeid)

    return FilesAndFolders(config, log)
