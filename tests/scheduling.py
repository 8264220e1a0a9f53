"""How `make test TEST_WORKERS=2` hands files to pytest-xdist workers (a pytest plugin, loaded by conftest.py).

`--dist loadfile` gives each worker whole files, so a file's module fixtures are built once. Some
folders share a fixture too costly to start twice: the real Slurm cluster and SkyPilot API
server of tests/skypilot_real (~100 s to start, ~1 GiB), which two workers would each bring up side
by side on a 2-core machine. Each `ONE_WORKER` folder is therefore one unit of work: its files run
on one worker, one after the other, sharing it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
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


# The files that take minutes, slowest first (`--durations`, bench/RESULTS.md 2026-12-03).
# `make test TEST_WORKERS=2` runs two pytest-xdist workers that take whole files in collection order
# (`--dist loadfile --no-loadscope-reorder`): started first, the long files run beside the many short
# ones instead of leaving one worker alone at the end. A scheduling hint only: a file missing here
# runs all the same.
SLOW_FIRST = (
    "tests/skypilot_real/",
    "tests/search_lab/test_search_cli.py",
    "tests/fleet/test_skypilot_fleet.py",
    "tests/agent_real/test_real_failures.py",
    "tests/fleet/test_fleet.py",
    "tests/harness/test_train.py",
    "tests/demo/",
    "tests/fleet/test_attempt_processes.py",
    "tests/fleet/test_skypilot_runner.py",
    "tests/harness/test_tune.py",
    "tests/agent/test_supervisor.py",
    "tests/reliability/test_controller_kills.py",
    "tests/fleet/test_health_fleet.py",
)


def slow_first(nodeid: str) -> int:
    """The rank of a test's file in `SLOW_FIRST` (the rest after it, in collection order)."""
    path = nodeid.split("::", 1)[0]
    return next((i for i, prefix in enumerate(SLOW_FIRST) if path.startswith(prefix)), len(SLOW_FIRST))


@pytest.hookimpl(trylast=True)  # after `-k` / `-m` deselected what will not run anyway
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker, put the `SLOW_FIRST` files first; a serial run keeps its usual order.

    The order must be set where the workers collect: the controller does not collect, it hands out
    the workers' (identical) collection. xdist gives each worker `numprocesses = None`, so a check
    on that option never sorted anything and tests/skypilot_real ran last, alone (2026-12-03).
    """
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: slow_first(item.nodeid))  # stable: each file keeps its order


# The niceness of a `ONE_WORKER` folder's services while other workers share the box.
BACKGROUND_NICE = 19


@contextlib.contextmanager
def in_the_background(config: pytest.Config) -> Iterator[int]:
    """Under xdist, run the block (and every process it starts) at nice `BACKGROUND_NICE`; yields the niceness.

    tests/skypilot_real's services (Slurm, sshd, the SkyPilot API server, the clusters' skylets and
    set-up) are waits on machinery that can use whatever CPU the other worker leaves, while the
    other worker's tests time real trainings against their budgets and graces: at equal priority the
    three launches (load 13-25 on two cores) made an honest hand-in late. At nice 19 they take
    ~1.5 % of a core the other worker wants and all of one it leaves idle. Children inherit the
    niceness; Slurm's job steps take slurmd's (`PropagatePrioProcess=0`, its default). A serial run
    keeps its priority: nothing else of the suite runs beside it. Linux sets niceness per thread, so
    the calling thread's is set and put back (raising it again needs root, which the folder needs anyway).
    """
    if not hasattr(config, "workerinput") or os.geteuid() != 0:
        yield os.getpriority(os.PRIO_PROCESS, 0)
        return
    before = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, BACKGROUND_NICE)
    try:
        yield BACKGROUND_NICE
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)
