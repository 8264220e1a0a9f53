"""Issue 36: a remote run's machine health is sampled on its worker, per experiment (`fleet/worker_health.py`).

The sampler runs beside each experiment on the node (the run script starts it), finds the run's
processes by their mark, and reports unjudged figures the controller judges with its own
thresholds. Starvation is made deterministic here by pinning three busy processes to one core:
each gets at most a third of it, whatever else the machine does.
Run: `pytest -q tests/fleet/test_worker_health.py` (about 15 s on 2 cores).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labkit import wait_until
from nightlab import procs
from nightlab.fleet.health import MIN_CPU_SHARE_ENV, Health, HealthWatch, judge
from nightlab.fleet.worker_health import pick_gpu

# Burns argv[2] seconds of CPU (not wall: the same amount on a busy machine) pinned to core argv[1].
BURN = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
while time.process_time() < float(sys.argv[2]):
    pass
time.sleep(1.5)  # a thread's last second before it exits is not seen (fleet/health.py): outlast a sample
"""


def _marked(mark: str, *argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", BURN, *argv], env={**os.environ, procs.MARK: mark})


def _sampler(
    tmp_path: Path, mark: str, *, threads: int = 1, exclude: tuple[int, ...] = ()
) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / f"health-{len(list(tmp_path.iterdir()))}.json"
    argv = [sys.executable, "-m", "nightlab.fleet.worker_health", "--mark", mark, "--threads", str(threads)]
    argv += ["--exclude", *map(str, exclude), "--out", str(out)]
    env = {k: v for k, v in os.environ.items() if k not in ("NIGHTLAB_GPU", "CUDA_VISIBLE_DEVICES")}
    return subprocess.Popen(argv, env=env), out


def _stop(sampler: subprocess.Popen, out: Path) -> dict:
    sampler.send_signal(signal.SIGTERM)
    assert sampler.wait(timeout=30) == 0
    return json.loads(out.read_text())


@pytest.fixture
def reap():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:  # by PID, even when the test failed
        if p.poll() is None:
            p.kill()
            p.wait()


def test_three_processes_pinned_to_one_core_are_reported_starved(tmp_path, reap):
    mark = f"test-starve-{os.getpid()}"
    sampler, out = _sampler(tmp_path, mark)
    reap.append(sampler)
    core = min(os.sched_getaffinity(0))
    burners = [_marked(mark, str(core), "0.7") for _ in range(3)]
    reap.extend(burners)
    for b in burners:
        assert b.wait(timeout=120) == 0
    report = _stop(sampler, out)
    assert report["cpu_seconds"] >= 3 * 0.7 - 0.05  # all three, whole, by the last values seen
    assert report["got_share"] < 0.6 and report["waited_seconds"] >= 1.0, report
    assert report["threads"] == 1 and report["samples"] >= 1
    assert "degraded" not in report and "threshold" not in report  # the worker never judges
    health = judge(Health.from_report(report), min_got_share=0.7)
    assert health.degraded and health.reason.startswith("starved: ")


def test_the_run_script_s_own_processes_and_unmarked_ones_do_not_count(tmp_path, reap):
    mark = f"test-exclude-{os.getpid()}"
    excluded = _marked(mark, str(min(os.sched_getaffinity(0))), "0.6")  # e.g. the run script's shell
    stranger = subprocess.Popen(
        [sys.executable, "-c", BURN, str(min(os.sched_getaffinity(0))), "0.6"]
    )  # another run: no mark
    reap.extend([excluded, stranger])
    sampler, out = _sampler(tmp_path, mark, exclude=(excluded.pid,))
    reap.append(sampler)
    counted = _marked(mark, str(min(os.sched_getaffinity(0))), "0.4")
    reap.append(counted)
    for p in (excluded, stranger, counted):
        assert p.wait(timeout=120) == 0
    report = _stop(sampler, out)
    assert 0.35 <= report["cpu_seconds"] < 0.6, report  # the counted one's 0.4 s only


def test_a_sampler_whose_run_script_died_reports_and_exits(tmp_path, reap):
    """A cancelled job may kill its run script before it stops the sampler: the sampler must not linger."""
    out = tmp_path / "health.json"
    parent = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-m', 'nightlab.fleet.worker_health', '--mark', 'none',"
        f" '--out', {str(out)!r}])\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(1.0)\n"
    )
    script = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    reap.append(script)
    sampler_pid = int(script.stdout.readline())
    script.kill()  # no SIGTERM from it: SIGKILL, as a cancelled job's process group gets
    script.wait()
    wait_until(lambda: out.exists() and not _alive(sampler_pid), timeout=30)
    assert json.loads(out.read_text())["wall_seconds"] > 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return procs.table().get(pid) is not None  # a zombie is not alive


@pytest.mark.parametrize(
    ("indices", "lane", "visible", "picked"),
    [
        ([0, 1, 2, 3], "2", "2", 2),  # a Ray lane pinned to GPU 2
        ([0, 1, 2, 3], None, "3", 3),  # Slurm set the step's GPU
        ([0], "2", "2", 0),  # a step confined to its device sees it as 0
        ([0, 1], None, "GPU-5f0c", None),  # a UUID, two GPUs: cannot tell which
        ([], "0", "0", None),  # no GPU (nvidia-smi absent or empty)
        ([0, 1, 2, 3], "2,3", "2,3", 2),  # two GPUs a lane: the first
    ],
)
def test_the_lane_s_gpu_is_the_one_judged(indices, lane, visible, picked):
    assert pick_gpu(indices, lane, visible) == picked


@pytest.mark.parametrize(
    "report",
    [
        [1, 2],
        {"cpu_seconds": 3.0},  # no wall
        {"wall_seconds": "30"},
        {"wall_seconds": 30.0, "got_share": True},
        {"wall_seconds": 30.0, "waited_seconds": -1.0},
        {"wall_seconds": 30.0, "threads": 1.5},
        {"wall_seconds": 30.0, "throttle": {"hw-slowdown": "all"}},
    ],
)
def test_a_malformed_report_is_no_health_at_all(report):
    assert Health.from_report(report) is None


def test_a_report_cannot_bring_its_own_verdict():
    """The line comes from the worker's log: a run that forges `degraded: false` changes nothing."""
    forged = {
        "wall_seconds": 30.0,
        "threads": 1,
        "cpu_seconds": 6.0,
        "waited_seconds": 24.0,
        "got_share": 0.2,
        "degraded": False,
        "reason": None,
        "threshold": 0.0,
    }
    health = Health.from_report(forged)
    assert health is not None and health.threshold is None
    assert judge(health, min_got_share=0.7).degraded


class _Attempt:
    def __init__(self, attempt_id: int) -> None:
        self.id, self.experiment_id, self.started_at = attempt_id, f"e{attempt_id}", time.time()


class _Fleet:
    min_cpu_share, min_clock_share = 0.7, 0.8


def test_the_controller_judges_a_remote_report_by_its_gpu_when_it_has_one(monkeypatch):
    monkeypatch.setenv(MIN_CPU_SHARE_ENV, "")  # the lab's own threshold (0.7), not the suite's
    watch = HealthWatch(_Fleet(), [])
    starved_cpu = {
        "wall_seconds": 30.0,
        "threads": 2,
        "cpu_seconds": 10.0,
        "waited_seconds": 20.0,
        "got_share": 0.33,
    }
    # a CPU-only worker: judged by its CPU (the controller's own threshold)
    assert watch.finish(_Attempt(1), reported=starved_cpu).degraded
    # a GPU lane: its CPU threads wait on the card; the GPU's clock decides
    on_gpu = {**starved_cpu, "gpu": 2, "sm_clock_share": 0.95}
    assert not watch.finish(_Attempt(2), reported=on_gpu).degraded
    throttled = {**on_gpu, "sm_clock_share": 0.6}
    assert "GPU 2 SM clock 60%" in watch.finish(_Attempt(3), reported=throttled).reason
    # nothing reported (an older worker, a lost job): no health, never degraded
    assert watch.finish(_Attempt(4), reported=None) is None
    assert watch.finish(_Attempt(5), reported={"wall_seconds": "x"}) is None


def test_a_lane_s_report_carries_its_own_gpu_and_the_controller_judges_it(tmp_path, monkeypatch):
    """On a 4-GPU node the lane of GPU 2 reports GPU 2's clocks (a stand-in `nvidia-smi` here), not GPU 0's."""
    import threading

    from nightlab.fleet.health import GpuWatcher
    from nightlab.fleet.worker_health import WorkerSampler

    smi = tmp_path / "nvidia-smi"
    rows = "\\n".join(f"{i}, {1200 if i == 2 else 1980}, 1980, 97, 0x0" for i in range(4))
    smi.write_text(f"#!/bin/sh\nprintf '{rows}\\n'\n")
    smi.chmod(0o755)
    sampler = WorkerSampler(
        mark=f"test-gpu-{os.getpid()}",
        threads=1,
        exclude=set(),
        gpus=GpuWatcher(interval=0.05, command=str(smi)),
    )
    thread = threading.Thread(target=sampler.run, kwargs={"interval": 0.05})
    thread.start()
    wait_until(lambda: 2 in sampler.gpus.indices(), what="a GPU sample")
    time.sleep(0.2)
    sampler.stop()
    thread.join(10)
    report = sampler.report(lane="2", visible="2").measurements()
    assert report["gpu"] == 2 and report["sm_clock_share"] == pytest.approx(1200 / 1980, abs=1e-3)
    monkeypatch.setenv(MIN_CPU_SHARE_ENV, "")
    health = HealthWatch(_Fleet(), []).finish(_Attempt(9), reported=report)
    assert health.degraded and "GPU 2 SM clock 61%" in health.reason
