"""Machine health (fleet/health.py): the thresholds, the samplers on real processes, the capacity check.

The CPU tests run real processes: a starved group is made starved beyond doubt (more
busy processes than the cores they are pinned to, so each gets at most half of what it
asks for whatever else the machine runs), and a healthy one is a process that asks for
little CPU, so background load on a shared CI machine cannot flip either verdict.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from nightlab.fleet.backend import WorkerSlot
from nightlab.fleet.capacity import capacity_problem
from nightlab.fleet.health import (
    MIN_WAITED_SECONDS,
    CpuSampler,
    Health,
    gpu_health,
    judge,
    parse_nvidia_smi,
    scan_runs,
    wait_floor,
)
from nightlab.procs import MARK

SPIN = """
import os, sys, time
n, seconds = int(sys.argv[1]), float(sys.argv[2])
for _ in range(n - 1):
    if os.fork() == 0:
        break
end = time.time() + seconds
x = 0
while time.time() < end:
    x += 1
"""


def test_judge_marks_starved_runs_beyond_the_thresholds():
    starved = judge(
        Health(wall_seconds=60, threads=2, cpu_seconds=40, waited_seconds=80, cpu_share=0.33, got_share=0.33)
    )
    assert starved.degraded
    assert starved.reason == (
        "starved: it got 33% of the CPU time it was ready to use (70% needed); its processes waited "
        "80.0 s in all for a free core during its 60 s run on a 2-core slot: the machine was busy; "
        "stop other work on it or run fewer slots"
    )
    assert (
        "got 33% of the CPU time it was ready to use; used 40.0 CPU-s of 120 available" in starved.summary()
    )
    # the same share over a few scheduler ticks is not judged: start-up noise
    short = judge(
        Health(wall_seconds=1, threads=1, cpu_seconds=0.1, waited_seconds=0.2, cpu_share=0.1, got_share=0.33)
    )
    assert not short.degraded
    # a run that did not ask for the CPU (it sleeps, waits on a GPU) is healthy whatever its cpu_share
    idle = judge(
        Health(wall_seconds=60, threads=2, cpu_seconds=1, waited_seconds=0.01, cpu_share=0.01, got_share=0.99)
    )
    assert not idle.degraded and idle.reason is None
    assert not judge(starved, min_got_share=0).degraded  # 0 turns the check off
    assert Health.from_dict(starved.to_dict()) == starved


def _cpu_bound(wall: float, threads: int, got: float) -> Health:
    """A run whose threads wanted a core all the time and got `got` of it."""
    cpu, waited = got * wall * threads, (1 - got) * wall * threads
    return Health(
        wall_seconds=wall,
        threads=threads,
        cpu_seconds=cpu,
        waited_seconds=waited,
        cpu_share=got,
        got_share=got,
    )


def test_the_wait_floor_is_relative_to_the_run():
    # a 4 s run that got 23 % of the CPU it asked for is starved like a long one (the former fixed
    # 5 s floor passed it: it waited 3.1 s)
    assert judge(_cpu_bound(4, 1, 0.23)).degraded
    assert judge(_cpu_bound(300, 2, 0.5)).degraded
    assert not judge(_cpu_bound(300, 2, 0.75)).degraded
    assert wait_floor(4, 1) == pytest.approx(0.5)  # 10 % of 4 s is under the 0.5 s of scheduler ticks
    assert wait_floor(300, 2) == pytest.approx(60.0)
    # a long run that hardly asked for the CPU: it lost 20 s of 300 (7 %) waiting, under the floor
    sleepy = Health(
        wall_seconds=300, threads=1, cpu_seconds=20, waited_seconds=20, cpu_share=0.07, got_share=0.5
    )
    assert not judge(sleepy).degraded
    # and a sub-second run is a few scheduler ticks, whatever its share
    assert not judge(_cpu_bound(0.5, 1, 0.1)).degraded


def test_gpu_clock_and_throttle_reasons():
    text = "0, 1980, 1980, 97, 0x0000000000000000\n1, 1275, 1980, 99, 0x0000000000000004\n2, [N/A], 1980, 0, 0x1\n"
    rows = parse_nvidia_smi(text)
    assert set(rows) == {0, 1} and rows[1]["reasons"] == 4
    healthy = judge(Health(wall_seconds=300, **gpu_health([{**rows[0], "ts": 1}] * 10, 0)))
    assert not healthy.degraded and healthy.sm_clock_share == 1.0
    capped = judge(Health(wall_seconds=300, **gpu_health([{**rows[1], "ts": 1}] * 10, 1)))
    assert capped.degraded and "SM clock 64% of max" in capped.reason
    assert capped.throttle == {"sw-power-cap": 1.0}
    hot = [{"sm": 1900.0, "max_sm": 1980.0, "util": 99.0, "reasons": float(0x40), "ts": 1}] * 3
    hot += [{"sm": 1980.0, "max_sm": 1980.0, "util": 99.0, "reasons": 0.0, "ts": 1}] * 7
    thermal = judge(Health(wall_seconds=300, **gpu_health(hot, 0)))
    assert thermal.degraded and "hw-thermal in 30% of samples" in thermal.reason
    # idle samples (between runs, during start-up) never count
    assert gpu_health([{**rows[1], "util": 0.0, "ts": 1}], 1) == {"gpu": 1}


def _slot(name, tier, **info):
    return WorkerSlot(name=name, tier=tier, backend="local", info=info)


def test_capacity_problem_names_the_fix():
    two = [_slot("cpu-0", "cpu", threads=2)]
    assert capacity_problem(two, cores=2) is None
    line = capacity_problem([*two, _slot("cpu2-0", "cpu2", threads=2)], cores=2)
    assert line.startswith("the local CPU slots ask for 4 threads but this machine lets nightlab use 2 cores")
    assert "cpu: 1 x 2, cpu2: 1 x 2" in line and "oversubscribe = true" in line and "\n" not in line
    gpus = [_slot("h-gpu0", "h100", gpu=0), _slot("x-gpu0", "h200", gpu=0)]
    assert "GPU 0 is used by 2 slots (h-gpu0, x-gpu0)" in capacity_problem(gpus, cores=64)
    remote = [WorkerSlot(name="sky-0", tier="h100", backend="skypilot", info={"threads": 99})]
    assert capacity_problem(remote, cores=1) is None


def _group(*args: str, cores: set[int] | None = None, mark: str | None = None) -> subprocess.Popen:
    def pin():
        if cores is not None:
            os.sched_setaffinity(0, cores)

    env = {**os.environ, MARK: mark} if mark else None
    return subprocess.Popen([sys.executable, "-c", *args], start_new_session=True, preexec_fn=pin, env=env)


def _sample_until_exit(proc: subprocess.Popen, threads: int, mark: str | None = None) -> Health:
    sampler = CpuSampler(root=proc.pid, mark=mark, threads=threads, started_at=time.time())
    try:
        while proc.poll() is None:
            sampler.add(scan_runs({"run": (proc.pid, mark)})["run"])
            time.sleep(0.25)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return judge(sampler.health(ended_at=time.time()))


@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="needs Linux schedstat")
def test_a_group_of_busy_processes_on_one_core_is_starved():
    # 3 busy processes pinned to one core: each gets at most a third of what it asks for
    core = min(os.sched_getaffinity(0))
    proc = _group(SPIN, "3", "4", cores={core})
    health = _sample_until_exit(proc, threads=1)
    assert health.degraded, health
    assert health.got_share < 0.4 and health.waited_seconds >= MIN_WAITED_SECONDS
    assert "starved" in health.reason


@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="needs Linux schedstat")
def test_a_process_that_asks_for_little_cpu_is_healthy_under_any_load():
    proc = _group("import time\nfor _ in range(10): time.sleep(0.3); sum(range(2000))")
    health = _sample_until_exit(proc, threads=2)
    assert not health.degraded, health
    assert health.cpu_share < 0.2 and health.waited_seconds < wait_floor(health.wall_seconds, 2)


def test_a_gpu_slot_is_judged_by_its_clocks_through_nvidia_smi(tmp_path):
    """The GPU path end to end with a stand-in `nvidia-smi` (a power-capped card at 61 % of its max clock)."""
    from nightlab.config import FleetConfig
    from nightlab.fleet.health import GpuWatcher, HealthWatch

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, 1210, 1980, 98, 0x0000000000000004'\necho '1, 1980, 1980, 97, 0x0'\n")
    smi.chmod(0o755)
    slots = [_slot("h200-gpu0", "h200", gpu=0), _slot("h200-gpu1", "h200", gpu=1)]
    watch = HealthWatch(FleetConfig(pools=(), default_tier="h200"), slots, gpus=GpuWatcher(command=str(smi)))

    class Attempt:
        def __init__(self, i):
            self.id, self.experiment_id, self.started_at = i, f"e{i}", time.time() - 1

    procs = [_group("import time; time.sleep(30)") for _ in slots]
    try:
        for i, (slot, proc) in enumerate(zip(slots, procs, strict=True)):
            watch.watch(Attempt(i), slot, {"pgid": proc.pid})
        for _ in range(3):
            watch.sample()
            watch.gpus.sample_once()
        slow, fine = watch.finish(Attempt(0)), watch.finish(Attempt(1))
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert (
        slow.degraded
        and "GPU 0 SM clock 61% of max" in slow.reason
        and slow.throttle == {"sw-power-cap": 1.0}
    )
    assert not fine.degraded and fine.sm_clock_share == 1.0 and fine.threads == 1


@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="needs Linux schedstat")
def test_a_child_in_a_session_of_its_own_still_counts():
    """The sandbox (`bwrap --new-session`) moves train.py out of the wrapper's process group."""
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    end = time.time() + 1.5\n    while time.time() < end: pass\n    os._exit(0)\nos.wait()"
    proc = _group(code)
    health = _sample_until_exit(proc, threads=1)
    # the busy child was found through its parent: it was runnable (on a core or waiting) ~1.5 s
    assert health.cpu_seconds + health.waited_seconds > 1.0, health


@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="needs Linux schedstat")
def test_an_orphan_in_a_session_of_its_own_counts_by_its_mark(tmp_path):
    """A daemon whose parent exited is in no tree or session of the run: its environment's mark finds it."""
    done = tmp_path / "done"
    code = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        end = time.time() + 1.5\n"
        "        while time.time() < end: pass\n"
        f"        open({str(done)!r}, 'w').close()\n"
        "    os._exit(0)\n"
        "os.wait()\n"
    )
    mark = f"{tmp_path}/attempt-1"
    proc = _group(code, mark=mark)
    proc.wait()  # the wrapper is gone: only the orphan is left
    sampler = CpuSampler(root=proc.pid, mark=mark, threads=1, started_at=time.time())
    while not done.exists():
        sampler.add(scan_runs({"run": (proc.pid, mark)})["run"])
        time.sleep(0.1)
    health = sampler.health(ended_at=time.time())
    # it was runnable (on a core or waiting) most of its 1.5 s, all seen through the mark
    assert health.cpu_seconds + health.waited_seconds > 0.8, health
    assert scan_runs({"other": (None, f"{tmp_path}/attempt-2")})["other"] == {}


def test_a_late_hand_in_on_a_starved_machine_may_be_degraded_and_nothing_else_invalid():
    """Issue 30: starvation slows export and save as much as training; other invalid runs stay invalid."""
    from nightlab.fleet.health import health_may_judge
    from nightlab.ledger import Outcome

    late = {"handin_delay_seconds": 12.0, "handin_grace_seconds": 10.5}
    assert health_may_judge(Outcome.OK, {})
    assert health_may_judge(Outcome.INVALID, late)
    assert not health_may_judge(
        Outcome.INVALID, {**late, "handin_delay_seconds": 3.0}
    )  # invalid for another reason
    assert not health_may_judge(Outcome.INVALID, {})
    assert not health_may_judge(Outcome.CRASH_EXCEPTION, late)
