"""The resident runner (fleet/skypilot/residents.py + resident.py) against the fake SDK.

A pool with `infra = "slurm/<host>"` runs one long-lived runner job per cluster; the fake's
clusters are local directories, so the runner's helper runs as a local process
(`FakeSky.local_channels`). The same scenarios run on the real SkyPilot + Slurm in
tests/skypilot_real (the conformance suite).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("sky")

from labkit import wait_until  # noqa: E402
from nightlab.config import load_config  # noqa: E402
from nightlab.fleet.backend import RunSpec, WorkerSlot  # noqa: E402
from nightlab.fleet.skypilot import SkyPilotBackend, skypilot_slots  # noqa: E402
from nightlab.fleet.skypilot import core as sky_core  # noqa: E402
from nightlab.testing.fake_sky import FakeSky  # noqa: E402

SCALE = 0.001

RUNNER_POOL = """
[[fleet.pool]]
backend = "skypilot"
tier = "slurm"
workers = 2
infra = "slurm/fakehost"
"""


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(sky_core, "STATUS_INTERVAL", 0.05)
    monkeypatch.setattr(sky_core, "RETRY_DELAY", 0.01)
    monkeypatch.setattr(sky_core, "FEED_INTERVAL", 0.05)
    monkeypatch.setattr(sky_core, "VAGUE_PATIENCE", 0.5)
    monkeypatch.setattr(sky_core, "FIND_PATIENCE", 2.0)
    monkeypatch.setattr(sky_core, "RESIDENT_READY_PATIENCE", 30.0)


@pytest.fixture
def fake(tmp_path, monkeypatch, fast):
    fake = FakeSky(tmp_path / "clusters", scale=SCALE).install(monkeypatch)
    yield fake
    fake.stop_jobs()


@pytest.fixture
def lab(make_lab) -> Path:
    return make_lab(1, timeout=30, extra_pools=RUNNER_POOL)


def test_the_conformance_suite_through_the_runner_and_through_exec(lab, fake):
    # what tests/skypilot_real runs on the real SDK: a Slurm pool's runner, and `runner = false`
    from nightlab.testing.skypilot_conformance import EXPECTED, Suite

    got = Suite(lab, sdk=fake, patience=30).run_modes("slurm-slurm-0", "slurm-slurm-1")
    assert sorted(got) == ["exec", "runner"]
    differing = {(mode, k): v for mode in got for k, v in got[mode].items() if v != EXPECTED[k]}
    assert not differing


# ---------------------------------------------------------------------------- helpers


def backend_of(lab: Path, fake: FakeSky) -> SkyPilotBackend:
    return SkyPilotBackend(load_config(lab / "nightlab.toml"), lab_dir=lab, sdk=fake)


def slot_of(lab: Path, index: int = 0) -> WorkerSlot:
    pool = next(p for p in load_config(lab / "nightlab.toml").fleet.pools if p.backend == "skypilot")
    return skypilot_slots(pool)[index]


def spec_of(lab: Path, eid: str, code: str, *, timeout: float = 60) -> RunSpec:
    import subprocess

    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=lab, capture_output=True, text=True
    ).stdout.strip()
    return RunSpec(
        experiment_id=eid,
        attempt=1,
        snapshot=head,
        command=f'python -c "{code}"',
        env={"NIGHTLAB_EXPERIMENT": eid, "NIGHTLAB_SEED": "0", "NIGHTLAB_TIER": "slurm"},
        timeout=timeout,
        run_dir=lab / ".nightlab" / "t" / eid,
        lab_dir=lab,
    )


def runner_execs(fake: FakeSky, cluster: str | None = None) -> list[str]:
    return [
        c[2]["job"]
        for c in fake.calls
        if c[0] == "exec"
        and c[2]["job"].startswith("nightlab-runner-")
        and (cluster is None or c[1][0] == cluster)
    ]


def up(backend: SkyPilotBackend, slot: WorkerSlot) -> None:
    wait_until(lambda: backend.available(slot), timeout=30)


def end(backend: SkyPilotBackend, slot: WorkerSlot, spec: RunSpec, handle: dict, timeout: float = 30):
    return wait_until(lambda: backend.poll(slot, spec, handle), timeout=timeout)


def with_edited_record(
    lab: Path, fake: FakeSky, **changes: object
) -> tuple[SkyPilotBackend, WorkerSlot, dict]:
    """`fleet up`, then `changes` to the first worker's runner record; a new backend, its slot, the record."""
    from nightlab.fleet.skypilot import fleet_up

    fleet_up(lab, sdk=fake)
    slot = slot_of(lab)
    backend = backend_of(lab, fake)
    record = backend.jobs.residents._record_path(backend.cluster(slot.name))
    data = json.loads(record.read_text())
    record.write_text(json.dumps({**data, **changes}))
    return backend, slot, data


def runs_ok(backend: SkyPilotBackend, slot: WorkerSlot, spec: RunSpec) -> None:
    """Wait for the slot's cluster, run `spec` there, and see it end with exit 0."""
    up(backend, slot)
    ended = end(backend, slot, spec, backend.launch(slot, spec))
    assert (ended.exit_code, ended.lost) == (0, False), ended


OK = "import time; time.sleep(0.5); print('---'); print('val_bpb: 1.25')"
HANG = "import time; time.sleep(600)"


# ---------------------------------------------------------------------------- the wave


def test_a_wave_runs_on_one_runner_job_per_cluster(lab, fake):
    from test_skypilot_fleet import ControllerThread, attempts, finished, submit

    ids = [submit(lab, f"run {i}", "slurm", SLEEP="0.5", LR=f"0.0{i + 1}") for i in range(6)]
    ids.append(submit(lab, "crashes", "slurm", MODE='"crash"'))
    with ControllerThread(lab):
        exps = finished(lab, ids, timeout=90)
    assert [exps[i].outcome for i in ids] == ["ok"] * 6 + ["crash:exception"]
    assert all(len(attempts(lab, i)) == 1 for i in ids)  # exactly once
    # one SkyPilot job per cluster ran them all: no experiment had an exec of its own
    execs = [c[2]["job"] for c in fake.calls if c[0] == "exec"]
    assert execs and all(j.startswith("nightlab-runner-") for j in execs) and len(execs) <= 2
    # never two at once on a cluster: each worker's runs follow one another
    by_worker: dict[str, list] = {}
    for i in ids:
        (a,) = attempts(lab, i)
        saved = json.loads(Path(a.log_path).with_name("sky.json").read_text())
        by_worker.setdefault(a.worker, []).append((saved["started_at"], a.ended_at))
    for spans in by_worker.values():
        spans.sort()
        assert all(b[0] >= a[1] - 0.5 for a, b in zip(spans, spans[1:], strict=False))
    assert exps[ids[0]].metrics["tier"] == "slurm" and "nightlab_code" in exps[ids[0]].metrics


# ---------------------------------------------------------------------------- a runner wrongly taken for dead


def test_failed_status_reads_never_end_a_runner_s_runs(lab, fake):
    # the likeliest duplicate overnight: one failed `sky status` / `job_status` read as a dead runner
    backend = backend_of(lab, fake)
    slot = slot_of(lab)
    try:
        up(backend, slot)
        spec = spec_of(lab, "e9001", "import time; time.sleep(2); print('---'); print('val_bpb: 1.0')")
        handle = backend.launch(slot, spec)
        wait_until(lambda: backend.jobs.get(spec).fed, timeout=30)
        fake.fail_status(10_000)  # the API server answers nothing about jobs from now on
        ended = end(backend, slot, spec, handle)
        assert (ended.exit_code, ended.lost) == (0, False)
    finally:
        fake.fail_status(0)
        backend.close()


def test_a_controller_that_reattaches_with_a_failing_status_read_adopts_the_live_runner(
    lab, fake, monkeypatch
):
    first = backend_of(lab, fake)
    slot = slot_of(lab)
    up(first, slot)
    spec = spec_of(lab, "e9002", "import time; time.sleep(3); print('---'); print('val_bpb: 1.0')")
    handle = first.launch(slot, spec)
    wait_until(lambda: backend_of_run_started(first, spec), timeout=30)
    first.close()
    fake.fail_status(3)  # the new controller's first reads fail
    second = backend_of(lab, fake)
    try:
        ended = end(second, slot, spec, handle)
        assert (ended.exit_code, ended.lost) == (0, False)
        assert len(runner_execs(fake, first.cluster(slot.name).name)) == 1  # adopted, not started again
    finally:
        second.close()


def backend_of_run_started(backend: SkyPilotBackend, spec: RunSpec) -> bool:
    run = backend.jobs.get(spec)
    return run is not None and run.started_at is not None


# ---------------------------------------------------------------------------- a runner that really died


def test_a_lost_cluster_ends_the_runner_s_runs_once_as_infra(lab, fake):
    backend = backend_of(lab, fake)
    slot = slot_of(lab)
    try:
        up(backend, slot)
        running, queued = spec_of(lab, "e9003", HANG), spec_of(lab, "e9004", OK)
        handles = [backend.launch(slot, running)]
        wait_until(lambda: backend_of_run_started(backend, running), timeout=30)
        handles.append(backend.launch(slot, queued))  # queued behind the hung one on the runner
        wait_until(lambda: (r := backend.jobs.get(queued)) and r.feed and not r.feed.putting, timeout=30)
        fake.preempt(backend.cluster(slot.name).name)
        ends = [end(backend, slot, s, h) for s, h in zip([running, queued], handles, strict=True)]
        assert all(e.lost and e.exit_code is None for e in ends), ends
    finally:
        backend.close()


def test_a_cancelled_runner_job_ends_its_runs_as_infra_and_a_new_runner_takes_the_next(lab, fake):
    backend = backend_of(lab, fake)
    slot = slot_of(lab)
    try:
        up(backend, slot)
        spec = spec_of(lab, "e9005", HANG)
        handle = backend.launch(slot, spec)
        wait_until(lambda: backend_of_run_started(backend, spec), timeout=30)
        cluster = backend.cluster(slot.name).name
        (job_id,) = [
            j.id for j in fake.clusters[cluster].jobs.values() if j.name.startswith("nightlab-runner-")
        ]
        fake.get(fake.cancel(cluster, job_ids=[job_id]))  # someone's `sky cancel`
        ended = end(backend, slot, spec, handle)
        assert ended.lost and "runner" in ended.detail
        nxt = spec_of(lab, "e9006", OK)
        after = end(backend, slot, nxt, backend.launch(slot, nxt))
        assert (after.exit_code, after.lost) == (0, False)
        assert len(runner_execs(fake, cluster)) == 2
    finally:
        backend.close()


# ---------------------------------------------------------------------------- start, adopt, give up


def test_fleet_up_starts_the_runners_and_the_controller_adopts_them(lab, fake):
    from nightlab.fleet.skypilot import fleet_up

    views = fleet_up(lab, sdk=fake)
    assert all(v["state"] == "up" and v["runner"].startswith("ready") for v in views), views
    backend = backend_of(lab, fake)
    slot = slot_of(lab)
    try:
        runs_ok(backend, slot, spec_of(lab, "e9007", OK))
        assert len(runner_execs(fake)) == 2  # the two `fleet up` started; none since
    finally:
        backend.close()


def test_a_runner_of_other_code_is_retired_and_replaced(lab, fake):
    backend, slot, data = with_edited_record(lab, fake, source="0ld50urce000")
    try:
        runs_ok(backend, slot, spec_of(lab, "e9008", OK))
        cluster = backend.cluster(slot.name).name
        assert len(runner_execs(fake, cluster)) == 2
        old = fake.clusters[cluster].jobs[data["job_id"]]
        assert old.status.value == "CANCELLED"
    finally:
        backend.close()


def test_a_runner_whose_helper_cannot_be_reached_falls_back_to_one_exec_per_run(lab, fake, monkeypatch):
    from nightlab.fleet.skypilot import residents

    monkeypatch.setattr(residents, "local_argv", lambda info, base: ["false"])
    monkeypatch.setattr(sky_core, "RESIDENT_READY_PATIENCE", 2.0)
    backend = backend_of(lab, fake)
    slot = slot_of(lab)
    try:
        runs_ok(backend, slot, spec_of(lab, "e9009", OK))
        cluster = backend.cluster(slot.name).name
        assert any(c[0] == "exec" and c[2]["job"] == "nightlab-e9009-a1" for c in fake.calls)
        assert cluster in backend.jobs.residents.off
        (runner,) = [j for j in fake.clusters[cluster].jobs.values() if j.name.startswith("nightlab-runner-")]
        wait_until(lambda: runner.status.is_terminal(), timeout=10)  # it would hold the cluster's queue
    finally:
        backend.close()


def test_a_runner_whose_exec_answer_was_lost_is_found_by_name(lab, fake):
    # the starter died between writing the record and learning the job id (F5): no orphan runner
    backend, slot, _ = with_edited_record(lab, fake, job_id=None, info=None)
    try:
        runs_ok(backend, slot, spec_of(lab, "e9010", OK))
        assert len(runner_execs(fake, backend.cluster(slot.name).name)) == 1
    finally:
        backend.close()


def test_runs_of_a_dead_runner_found_at_reattach_end_once_as_infra(lab, fake):
    # a stale epoch (F9): its runner's job ended while no controller watched; the second run is
    # re-attached only after the new controller has seen that runner end
    first = backend_of(lab, fake)
    slot = slot_of(lab)
    up(first, slot)
    spec, queued = spec_of(lab, "e9011", HANG), spec_of(lab, "e9013", OK)
    handle = first.launch(slot, spec)
    wait_until(lambda: backend_of_run_started(first, spec), timeout=30)
    queued_handle = first.launch(slot, queued)
    wait_until(lambda: (r := first.jobs.get(queued)) and r.feed and not r.feed.putting, timeout=30)
    cluster = first.cluster(slot.name).name
    first.close()
    (job,) = [j for j in fake.clusters[cluster].jobs.values() if j.name.startswith("nightlab-runner-")]
    fake.get(fake.cancel(cluster, job_ids=[job.id]))
    second = backend_of(lab, fake)
    try:
        ended = end(second, slot, spec, handle)
        assert ended.lost and ended.exit_code is None
        later = end(second, slot, queued, queued_handle, timeout=15)
        assert later.lost and later.exit_code is None
    finally:
        second.close()


def test_the_runner_option_is_checked():
    from nightlab.config import PoolConfig
    from nightlab.errors import UsageError
    from nightlab.fleet.sky_task import check_pool

    with pytest.raises(UsageError, match="use true"):
        check_pool(PoolConfig(backend="skypilot", tier="t", slots=1, options={"runner": "yes"}))
    with pytest.raises(UsageError, match="slurm/<cluster>"):
        check_pool(
            PoolConfig(backend="skypilot", tier="t", slots=1, options={"runner": True, "infra": "k8s"})
        )
    check_pool(
        PoolConfig(backend="skypilot", tier="t", slots=1, options={"runner": False, "infra": "slurm/x"})
    )


def test_turning_the_runner_off_retires_the_live_one(lab, fake):
    # exec jobs would wait behind a live runner until it idles out
    from labkit import commit
    from nightlab.fleet.skypilot import fleet_up

    fleet_up(lab, sdk=fake)
    toml = lab / "nightlab.toml"
    toml.write_text(
        toml.read_text().replace('infra = "slurm/fakehost"', 'infra = "slurm/fakehost"\nrunner = false')
    )
    commit(lab, "runner off")
    backend = backend_of(lab, fake)
    slot = slot_of(lab)
    try:
        runs_ok(backend, slot, spec_of(lab, "e9012", OK))
        cluster = backend.cluster(slot.name).name
        (runner,) = [j for j in fake.clusters[cluster].jobs.values() if j.name.startswith("nightlab-runner-")]
        assert runner.status.value == "CANCELLED"
    finally:
        backend.close()
