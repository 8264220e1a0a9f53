"""`nightlab fleet up` -> a wave -> `fleet down` through the real SkyPilot on a local Slurm cluster.

A lab whose pool is `backend = "skypilot"`, `infra = "slurm/localslurm"`, 2 workers, on the
synthetic target; the nightlab CLI runs in subprocesses pointed at the fixture's API server
(conftest.py, localsky.py). The clusters install nightlab the default way: the wheel the
controller builds of itself, shipped with the cluster task. The tests share one lab (built in
conftest.py, whose `fleet up` starts before the folder's first test) and run in file order: up, the
conformance suite, the wave (with a preemption and a SIGKILLed controller), down. The
conformance suite comes before the wave: the wave's preemption leaves one cluster lost, and
after it the suite's exec lane waited for that cluster's whole relaunch and set-up (~4 of its
~5 minutes, 2026-12-03); before it, both clusters `fleet up` set up are there to use, and it
runs (in a subprocess conftest.py starts once `fleet up` succeeded) while the GPU file runs.
Run: `pytest -q tests/skypilot_real` (as root; installs what is missing; minutes).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from localsky import POOL_WORKERS

from labkit import nightlab, wait_until

WORKERS = POOL_WORKERS

# the wave: name -> knobs; each also runs on the local CPU slot, and both must agree
WAVE = {
    "baseline": {},
    "lr-high": {"LR": "0.04"},
    "lr-low": {"LR": "0.005"},
    "crash": {"MODE": '"crash"'},
    "nan": {"MODE": '"nan"'},
    "no-summary": {"MODE": '"nothing"'},
    "hang": {"MODE": '"hang"'},
    "preempted": {"SLEEP": "20"},
    "slow": {"SLEEP": "5"},
}


@pytest.fixture(scope="module")
def env(slurm_lab) -> dict[str, str]:
    return slurm_lab.env


@pytest.fixture(scope="module")
def lab(slurm_lab) -> Path:
    """The folder's 2-worker lab (conftest.py), its `fleet up` under way since before the first test."""
    return slurm_lab.path


def cli(lab: Path, env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return nightlab(*args, cwd=lab, env=env, timeout=timeout)


def ledger_view(lab: Path):
    from nightlab.ledger import open_ledger

    with open_ledger(lab) as ledger:
        exps = {e.id: e for e in ledger.experiments(with_metrics=True)}
        tries = {eid: ledger.attempts(eid) for eid in exps}
        events = ledger.events(limit=100_000)
    return exps, tries, events


# ---------------------------------------------------------------------------- fleet up


@pytest.mark.timeout(900)  # minutes on a loaded 2-core box (the suite's default is 300 s)
def test_fleet_up_launches_and_sets_up_both_clusters(lab, env, slurm_lab):
    from nightlab.fleet.build import code_hash

    up = slurm_lab.up.result(timeout=1200)  # `fleet up --json`, begun before the first test
    rows = json.loads(up.stdout)
    assert [(r["worker"], r["state"]) for r in rows] == [(w, "up") for w in WORKERS], up.stderr
    status = json.loads(cli(lab, env, "fleet", "status", "--json").stdout)
    clusters = {c["worker"]: c for c in status["clusters"]}
    assert set(clusters) == set(WORKERS)
    for c in clusters.values():
        assert c["state"] == "up" and c["cost"] is not None  # Slurm has no prices: $0
        # the cluster runs the controller's own build, and the same torch
        assert c["nightlab_code"] == code_hash() and c["torch_version"] == version("torch")
    text = cli(lab, env, "fleet", "status").stdout
    assert "clusters (SkyPilot):" in text and f"({code_hash()})" in text
    _, _, events = ledger_view(lab)
    # set-up ran once per cluster
    assert sorted(e.worker for e in events if e.kind == "cluster-up") == WORKERS
    assert sorted(e.worker for e in events if e.kind == "cluster-launch") == WORKERS


# ---------------------------------------------------------------------------- conformance


@pytest.mark.timeout(1200)  # minutes on a loaded 2-core box (the suite's default is 300 s)
def test_the_conformance_suite_on_the_real_sdk(slurm_lab):
    # the scenarios tests/fleet runs on nightlab.testing.fake_sky, here on the real SkyPilot, on the
    # clusters `fleet up` set up, in both ways a Slurm pool runs experiments: its resident runner
    # (WORKERS[0]) and one `sky exec` per run (WORKERS[1], whose runner the exec lane's first backend
    # retires; the wave after it starts a new one there). `python -m nightlab.testing.skypilot_conformance
    # <lab> --runner W0 --exec W1`, started by conftest.py as soon as `fleet up` succeeded, while
    # the GPU file ran
    from nightlab.testing.skypilot_conformance import EXPECTED

    proc = slurm_lab.after("conformance").result(timeout=1200)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(got) == ["exec", "runner"]
    differing = {(mode, k): v for mode in got for k, v in got[mode].items() if v != EXPECTED[k]}
    assert not differing


# ---------------------------------------------------------------------------- the wave


def _submit(lab: Path, env: dict[str, str], name: str, tier: str, knobs: dict[str, str]) -> str:
    args = ["submit", "-m", f"{name} on {tier}", "--tier", tier, "--no-start", "--json"]
    for k, v in knobs.items():
        args += ["--set", f"{k}={v}"]
    return json.loads(cli(lab, env, *args).stdout)[0]["id"]


def _controller_pid(lab: Path, env: dict[str, str]) -> int:
    return int(cli(lab, env, "fleet", "start").stdout.strip())


def _open_attempt(lab: Path, eid: str):
    _, tries, _ = ledger_view(lab)
    running = [a for a in tries[eid] if a.ended_at is None]
    if not running or not running[0].log_path:  # an attempt gets its log path a moment after its row
        return None
    sky = Path(running[0].log_path).with_name("sky.json")
    text = sky.read_text() if sky.exists() else ""
    # its SkyPilot job exists, or its resident runner has started it
    return running[0] if "job_id" in text or "started_at" in text else None


def _slurm_job_of(local_sky, cluster: str) -> str:
    """The Slurm job (allocation) of a SkyPilot cluster: its name starts with the cluster's."""
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i %.200j"],
        env=local_sky.environ(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (job,) = [line.split()[0] for line in out.splitlines() if line.split()[1].startswith(cluster)]
    return job


@pytest.mark.timeout(1500)  # minutes on a loaded 2-core box (the suite's default is 300 s)
def test_a_wave_with_a_preemption_and_a_killed_controller(lab, env, local_sky):
    from nightlab.fleet.build import code_hash
    from nightlab.fleet.skypilot import cluster_name

    remote = {name: _submit(lab, env, name, "slurm", knobs) for name, knobs in WAVE.items()}
    local = {name: _submit(lab, env, name, "cpu", knobs) for name, knobs in WAVE.items()}
    pid = _controller_pid(lab, env)
    try:
        # a preemption: the cluster's Slurm allocation is cancelled while the run is in flight
        first = wait_until(lambda: _open_attempt(lab, remote["preempted"]), timeout=900, interval=1)
        subprocess.run(
            ["scancel", _slurm_job_of(local_sky, cluster_name(lab, first.worker))],
            env=local_sky.environ(),
            check=True,
        )

        def requeued():
            _, tries, _ = ledger_view(lab)
            return [a.failure for a in tries[remote["preempted"]]][:1] == ["infra"]

        wait_until(requeued, timeout=600, interval=1)
        # the controller dies (SIGKILL) with runs in flight; the next one re-attaches them
        wait_until(lambda: any(_open_attempt(lab, eid) for eid in remote.values()), timeout=600, interval=0.5)
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0)
        pid = _controller_pid(lab, env)

        def done():
            exps, _, _ = ledger_view(lab)
            return all(exps[e].status.name == "FINISHED" for e in [*remote.values(), *local.values()])

        wait_until(done, timeout=1500, interval=2)
    finally:
        cli(lab, env, "fleet", "stop")
    exps, tries, events = ledger_view(lab)
    outcome = {name: exps[eid].outcome for name, eid in remote.items()}
    # classified exactly as on the local backend
    assert outcome == {name: exps[eid].outcome for name, eid in local.items()}
    assert outcome == {
        "baseline": "ok",
        "lr-high": "ok",
        "lr-low": "ok",
        "crash": "crash:exception",
        "nan": "crash:nan",
        "no-summary": "crash:no-summary",
        "hang": "timeout",
        "preempted": "ok",
        "slow": "ok",
    }
    lost, retry = tries[remote["preempted"]][0], tries[remote["preempted"]][-1]
    for name, eid in remote.items():
        failures = [a.failure for a in tries[eid]]
        # exactly once: only the preempted run needed a second attempt, on the other worker (and
        # the runs queued behind it on the same cluster); besides, a run leased just before the
        # SIGKILL whose `sky exec` never reached SkyPilot is requeued ("no job ... after N s")
        earlier = tries[eid][:-1]
        assert all(a.failure == "infra" for a in earlier) and len(earlier) <= 2, (name, failures)
        assert all(a.worker == lost.worker or (a.detail or "").startswith("no job ") for a in earlier)
        assert name != "preempted" or earlier[0].worker == lost.worker
        assert all(a.ended_at is not None for a in tries[eid])
    # requeued on the other worker, even when its queue was full (two runs behind its running one)
    # and the lost cluster was up again first
    assert lost.worker in WORKERS and tries[remote["preempted"]][1].worker != lost.worker
    assert retry.failure == "ok"
    assert [e.worker for e in events if e.kind == "cluster-lost"] == [lost.worker]
    assert any(e.kind == "reattach" for e in events)
    # logs and summaries in the ledger, from the controller's own build on the cluster
    base = exps[remote["baseline"]]
    assert base.metrics["val_bpb"] == pytest.approx(exps[local["baseline"]].metrics["val_bpb"])
    assert base.metrics["tier"] == "slurm" and base.metrics["nightlab_code"] == code_hash()
    assert base.metrics["env_experiment"] == remote["baseline"]
    # the synthetic metric is 1 + 10 * log10(LR / 0.02)^2: 0.005 is worse than the baseline's 0.01
    assert exps[remote["lr-low"]].metrics["val_bpb"] > base.metrics["val_bpb"]
    assert "ValueError: boom at step 3" in exps[remote["crash"]].detail
    for eid in remote.values():
        (last,) = [a for a in tries[eid] if a.failure != "infra"] or tries[eid][-1:]
        assert Path(last.log_path).exists()
    # nothing ran twice. The runs went through each cluster's resident runner (one SkyPilot job
    # per runner, no exec per experiment), which claims each attempt by name once: no attempt's
    # name is claimed twice over all runners of both clusters
    jobs = []
    for worker in WORKERS:
        queue = subprocess.run(
            [str(Path(sys.executable).with_name("sky")), "queue", cluster_name(lab, worker)],
            env=env,
            capture_output=True,
            text=True,
        ).stdout
        jobs += [w for w in queue.split() if w.startswith("nightlab-")]
    assert not [j for j in jobs if j.startswith("nightlab-e")], jobs
    assert any(j.startswith("nightlab-runner-") for j in jobs), jobs
    # (the lost cluster's home, and its runner's files with it, went with its allocation)
    names = {f"{eid}-a{a.number}" for eid in remote.values() for a in tries[eid]}
    claimed = [p.name for p in local_sky.resident_claims() if p.name in names]
    assert claimed and len(claimed) == len(set(claimed)), sorted(claimed)


# ---------------------------------------------------------------------------- fleet down


@pytest.mark.timeout(600)  # minutes on a loaded 2-core box (the suite's default is 300 s)
def test_fleet_down_leaves_nothing(lab, env, local_sky, slurm_lab):
    from nightlab.fleet.skypilot import cluster_name

    down = cli(lab, env, "fleet", "down", timeout=600)
    assert set(down.stdout.split()) <= {cluster_name(lab, w) for w in WORKERS}
    wait_until(lambda: local_sky.jobs() == [], timeout=60, interval=1)
    status = subprocess.run(
        [str(Path(sys.executable).with_name("sky")), "status"], env=env, capture_output=True, text=True
    )
    assert "No existing clusters" in status.stdout, status.stdout
    assert not json.loads(cli(lab, env, "fleet", "status", "--json").stdout)["controller"]["running"]
    # no process of the SSH user from this run (another run, e.g. bench/fleet_real.py, may share the user)
    wait_until(lambda: local_sky.user_processes() == [], timeout=60, interval=1)
    slurm_lab.down_done = True  # the folder's teardown has nothing left to stop or take down here
