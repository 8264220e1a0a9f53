"""`make test TEST_WORKERS=2` keeps tests/skypilot_real on one worker, and starts it first (tests/scheduling.py, issue 31).

With plain `--dist loadfile` its two files went to the two workers at once, each bringing up its
own Slurm cluster and SkyPilot API server on the 2-core machine; and it ran last, alone, because
the slowest-first order was only set where xdist does not collect.
"""

from __future__ import annotations

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


def test_a_one_worker_folder_s_services_run_niced_under_xdist_and_the_worker_gets_its_priority_back():
    """`in_the_background`: under xdist (a config with `workerinput`) the block and what it starts
    run at `BACKGROUND_NICE`; the thread's niceness is put back after it; a serial run is untouched."""
    import threading
    from types import SimpleNamespace

    from scheduling import BACKGROUND_NICE, in_the_background

    seen: dict[str, object] = {}

    def child_nice() -> int:  # field 19 of /proc/<pid>/stat: a process started inside the block
        out = subprocess.run(["cat", "/proc/self/stat"], capture_output=True, text=True, check=True).stdout
        return int(out.rsplit(")", 1)[1].split()[16])

    def run() -> None:  # a thread of its own: Linux's niceness is per thread; the test's stays as it is
        seen["before"] = os.getpriority(os.PRIO_PROCESS, 0)
        with in_the_background(SimpleNamespace()) as nice:
            seen["serial"] = (nice, os.getpriority(os.PRIO_PROCESS, 0), child_nice())
        with in_the_background(SimpleNamespace(workerinput={"workerid": "gw0"})) as nice:
            seen["xdist"] = (nice, os.getpriority(os.PRIO_PROCESS, 0), child_nice())
        seen["after"] = os.getpriority(os.PRIO_PROCESS, 0)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    before = seen["before"]
    assert seen["serial"] == (before, before, before)
    # only root may give the priority back, and the folder needs root: without it nothing is niced
    expected = BACKGROUND_NICE if os.geteuid() == 0 else before
    assert seen["xdist"] == (expected, expected, expected)
    assert seen["after"] == before
