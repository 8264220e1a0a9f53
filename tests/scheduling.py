"""How `make test` (two workers by default) hands files to pytest-xdist workers (a pytest plugin, loaded by conftest.py).

`--dist loadfile` gives each worker whole files, so a file's module fixtures are built once. Some
folders share a fixture too costly to start twice: the real Slurm cluster and SkyPilot API
server of tests/skypilot_real (~100 s to start, ~1 GiB), which two workers would each bring up side
by side on a 2-core machine. Each `ONE_WORKER` folder is therefore one unit of work: its files run
on one worker, one after the other, sharing it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
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
# `make test` runs two pytest-xdist workers that take whole files in collection order
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


# How a `ONE_WORKER` folder's services share the box with the other workers (`in_the_background`).
BACKGROUND_NICE = 19
CPU_CGROUP = Path("/sys/fs/cgroup/cpu")  # cgroup v1's cpu controller (this kind of machine has it)
BACKGROUND_SHARES = 1024  # the whole group weighs what one process weighs (cgroup v1's default)


def cpu_cgroup_of(tid: int | str = "thread-self") -> Path | None:
    """The cgroup v1 cpu group a thread is in (a path under `CPU_CGROUP`); None without cgroup v1's cpu."""
    try:
        lines = Path(f"/proc/{tid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return CPU_CGROUP / path.lstrip("/")
    return None


def _background_group(parent: Path) -> Path | None:
    """A fresh group under `parent` with `BACKGROUND_SHARES`; None where cgroups cannot be made (not root,
    cgroup v2 only, a read-only /sys). Empty groups of earlier runs are removed first."""
    for stale in parent.glob("nightlab-tests-*"):
        with contextlib.suppress(OSError):
            stale.rmdir()  # fails while a process is still in it: left alone
    group = parent / f"nightlab-tests-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        (group / "cpu.shares").write_text(str(BACKGROUND_SHARES))
    except OSError:
        with contextlib.suppress(OSError):
            group.rmdir()
        return None
    return group


@contextlib.contextmanager
def in_the_background(config: pytest.Config) -> Iterator[Path | None]:
    """Under xdist, run the block and every process it starts as one background group; yields the
    cgroup (None where there is none: then only niced).

    tests/skypilot_real's services (Slurm, sshd, the SkyPilot API server, each cluster's skylet and
    set-up: ~200 processes at the launches, load 13-25 on two cores) are waits on machinery that can
    use whatever CPU the other worker leaves, while that worker's tests time real trainings against
    their budgets and graces: side by side at equal weight, an honest hand-in came late. Niceness
    alone does not bound them: the kernel's autogroups make each session (sshd's, slurmstepd's, the
    API server's) weigh as much as the test's process whatever its niceness. A cgroup v1 cpu group
    with `BACKGROUND_SHARES` makes the whole folder weigh as one process; its processes inherit it
    (Slurm's job steps too: `proctrack/linuxproc` and `task/none` move nothing). Niced as well, for a
    machine without cgroup v1. A serial run is untouched: nothing of the suite runs beside it. Both
    are per thread on Linux: the calling thread's are set and put back (needs root, as the folder does).
    """
    if not hasattr(config, "workerinput") or os.geteuid() != 0:
        yield None
        return
    tid = threading.get_native_id()
    nice, home = os.getpriority(os.PRIO_PROCESS, 0), cpu_cgroup_of()
    group = _background_group(home) if home is not None else None
    os.setpriority(os.PRIO_PROCESS, 0, BACKGROUND_NICE)
    try:
        if group is not None:
            (group / "tasks").write_text(str(tid))
    except OSError:  # removed under us (another run's sweep of empty groups): niced only
        group = None
    try:
        yield group
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        if group is not None and home is not None:
            (home / "tasks").write_text(str(tid))
            with contextlib.suppress(OSError):
                group.rmdir()  # a process still in it keeps it; the next run's `_background_group` removes it
