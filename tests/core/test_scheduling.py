"""`make test TEST_WORKERS=2` keeps tests/skypilot_real on one worker, and starts it first (tests/scheduling.py, issue 31).

With plain `--dist loadfile` its two files went to the two workers at once, each bringing up its
own Slurm cluster and SkyPilot API server on the 2-core machine; and it ran last, alone, because
the slowest-first order was only set where xdist does not collect.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

RECORD = """
import os
from pathlib import Path


def test_{name}():
    worker = os.environ["PYTEST_XDIST_WORKER"]
    Path(os.environ["RECORD_DIR"], "{name}").write_text(worker)
    with Path(os.environ["RECORD_DIR"], "order-" + worker).open("a") as order:
        order.write("{name}\\n")
"""


def test_the_real_services_folder_runs_first_on_one_worker_and_other_files_spread(tmp_path):
    inner, record = tmp_path / "tree", tmp_path / "record"
    record.mkdir()
    names = {"tests/skypilot_real/test_a.py": "a", "tests/skypilot_real/test_b.py": "b"}
    names.update({f"tests/aaa/test_{i}.py": str(i) for i in range(6)})  # collected before it
    for path, name in names.items():
        (inner / path).parent.mkdir(parents=True, exist_ok=True)
        (inner / path).write_text(RECORD.format(name=f"t{name}"))
    env = {**os.environ, "RECORD_DIR": str(record), "PYTHONPATH": str(TESTS)}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "scheduling", "-p", "no:cacheprovider", "-n", "2"]
    proc = subprocess.run(
        [*argv, "--dist", "loadfile", "--no-loadscope-reorder", "--rootdir", str(inner), "tests"],
        cwd=inner,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    worker = {p.name: p.read_text() for p in record.iterdir() if p.name.startswith("t")}
    assert len(worker) == 8
    assert (record / f"order-{worker['ta']}").read_text().split()[:2] == ["ta", "tb"]  # started first
    assert worker["ta"] == worker["tb"]  # one unit of work: one worker, one session fixture
    assert len(set(worker.values())) == 2  # the rest still spreads over both


def test_the_real_services_go_when_their_folder_ends_not_with_the_session():
    """The local Slurm cluster and API server (~1 GiB, a busy server) are torn down before the next
    folder's first test: its fixtures are package-scoped, which needs tests/skypilot_real/__init__.py."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--setup-plan", "-q", "-p", "no:cacheprovider"]
        + ["tests/skypilot_real", "tests/core/test_scheduling.py"],
        cwd=TESTS.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    down = next(i for i, line in enumerate(lines) if line.split() == ["TEARDOWN", "P", "local_sky"])
    after = next(i for i, line in enumerate(lines) if "tests/core/test_scheduling.py::" in line)
    assert down < after


def test_a_one_worker_folder_s_services_run_as_one_background_group_under_xdist_and_the_worker_gets_back():
    """`in_the_background`: under xdist (a config with `workerinput`) a process started in the block
    runs niced and, where cgroup v1's cpu controller can be used, in a group weighing one process;
    after the block the thread's niceness and group are its own again and the empty group is gone.
    A serial run is untouched."""
    import threading
    from types import SimpleNamespace

    from scheduling import BACKGROUND_NICE, BACKGROUND_SHARES, cpu_cgroup_of, in_the_background

    seen: dict[str, object] = {}

    def child() -> tuple[int, Path | None]:  # the niceness (stat's field 19) and cpu group of a new process
        proc = subprocess.Popen(["sleep", "5"])
        try:
            stat = Path(f"/proc/{proc.pid}/stat").read_text()
            return int(stat.rsplit(")", 1)[1].split()[16]), cpu_cgroup_of(proc.pid)
        finally:
            proc.kill()
            proc.wait()

    def run() -> None:  # a thread of its own: both are per thread on Linux; the test's stay as they are
        seen["before"] = (os.getpriority(os.PRIO_PROCESS, 0), cpu_cgroup_of())
        home = seen["before"][1]
        if home is not None and os.geteuid() == 0:  # a killed run's group, left empty
            with contextlib.suppress(OSError):
                (home / "nightlab-tests-1").mkdir()
        with in_the_background(SimpleNamespace()) as group:
            seen["serial"] = (group, child())
        with in_the_background(SimpleNamespace(workerinput={"workerid": "gw0"})) as group:
            shares = (group / "cpu.shares").read_text().strip() if group else None
            seen["xdist"] = (group, shares, child())
        seen["after"] = (os.getpriority(os.PRIO_PROCESS, 0), cpu_cgroup_of())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    nice, home = seen["before"]
    assert seen["serial"] == (None, (nice, home))
    assert seen["after"] == (nice, home)
    group, shares, started = seen["xdist"]
    if os.geteuid() != 0:  # only root may give the priority back, and the folder needs root
        assert (group, started) == (None, (nice, home))
        return
    if group is None:  # no usable cgroup v1 here: niced only
        assert started == (BACKGROUND_NICE, home)
        return
    assert started == (BACKGROUND_NICE, group) and group.parent == home
    assert shares == str(BACKGROUND_SHARES)
    assert not group.exists()  # removed once empty
    assert not (home / "nightlab-tests-1").exists()  # and a killed run's empty one swept at the start
