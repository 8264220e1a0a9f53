"""Issue 36 on the real SkyPilot + Slurm: a node of 4 generic GPUs is 4 slots, one runner each.

The fixture's node declares `Gres=gpu:h100:4` (gres.conf names 4 empty files as the devices:
localsky.py), enough for Slurm and SkyPilot to schedule and count GPUs. A pool of one
`H100:4` cluster runs 8 experiments: 4 at a time, each with its own GPU index, through one
resident runner per GPU (each a SkyPilot job asking for one GPU). Reuses the folder's
`local_sky` (conftest.py); its own lab and cluster (conftest.py's `gpu_lab`, launched before the
folder's first test beside the other file's), torn down at the end. This file runs first.
Run: `pytest -q tests/skypilot_real/test_gpu_slots_on_slurm.py` (as root; minutes).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from labkit import nightlab, wait_until

SLEEP = 15  # seconds per run: long enough that four overlap on a loaded 2-core box (the conformance suite runs beside it)


@pytest.fixture(scope="module")
def env(gpu_lab) -> dict[str, str]:
    return gpu_lab.env


@pytest.fixture(scope="module")
def lab(gpu_lab):
    """The folder's 4-GPU lab (conftest.py), its `fleet up` under way; torn down at this file's end,
    before the other file's `fleet down` test looks for anything left of the run."""
    yield gpu_lab.path
    gpu_lab.down()


def _cli(lab: Path, env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return nightlab(*args, cwd=lab, env=env, timeout=timeout)


@pytest.mark.timeout(1800)  # minutes on a loaded 2-core box: a launch with set-up, then 8 runs
def test_a_4_gpu_node_runs_8_experiments_4_at_a_time_each_on_its_own_gpu(lab, env, gpu_lab):
    from nightlab.ledger import open_ledger

    up = gpu_lab.up.result(timeout=1200)  # `fleet up --json`, begun before the first test
    (row,) = json.loads(up.stdout)
    assert (row["state"], row["slots"]) == ("up", 4), up.stderr
    assert row["runner"] == "4 of 4 lanes ready", row
    ids = []
    for i in range(8):
        out = _cli(
            lab, env, "submit", "-m", f"run {i}", "--tier", "h100", "--no-start", "--json",
            "--set", f"SLEEP={SLEEP}", "--set", f"LR=0.0{i + 1}",
        )  # fmt: skip
        ids.append(json.loads(out.stdout)[0]["id"])
    _cli(lab, env, "fleet", "start")
    try:

        def done():
            with open_ledger(lab) as ledger:
                exps = {e.id: e for e in ledger.experiments(with_metrics=False)}
            return all(exps[i].status.name == "FINISHED" for i in ids)

        wait_until(done, timeout=1500, interval=2)
        status = _cli(lab, env, "fleet", "status").stdout
    finally:
        _cli(lab, env, "fleet", "stop")
    with open_ledger(lab) as ledger:
        exps = {i: ledger.get(i) for i in ids}
        tries = {i: ledger.attempts(i) for i in ids}
    assert {i: e.outcome for i, e in exps.items()} == dict.fromkeys(ids, "ok"), {
        i: e.detail for i, e in exps.items()
    }
    assert all(len(t) == 1 for t in tries.values())  # exactly once
    seen, spans = {}, []
    for i in ids:
        run_dir = lab / ".nightlab" / "runs" / i / "attempt-1"
        match = re.search(r"lane gpu=(\S*) index=(\S*) threads=(\d+)", (run_dir / "log.txt").read_text())
        assert match, (run_dir / "log.txt").read_text()
        seen[i] = match.groups()
        saved = json.loads((run_dir / "sky.json").read_text())
        spans.append((saved["started_at"], saved["command_ended_at"]))
        assert match.group(2) == tries[i][0].worker.rsplit("-g", 1)[1]  # the run knows its lane
        # sampled on the node by its own sampler, as a slot of its lane's size (issue 36.1)
        health = exps[i].health
        assert health and health["samples"] >= 1 and health["threads"] == int(match.group(3)), health
    # each lane's runner holds the GPU Slurm gave its job (the run script keeps Slurm's choice)
    lane_gpu = {}
    for i in ids:
        lane_gpu.setdefault(seen[i][1], set()).add(seen[i][0])
    assert all(len(g) == 1 for g in lane_gpu.values()), lane_gpu  # a lane stays on one GPU
    assert sorted(g.pop() for g in lane_gpu.values()) == ["0", "1", "2", "3"]  # and no two share one
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    depth = [0]
    for _, step in edges:
        depth.append(depth[-1] + step)
    assert max(depth) == 4  # four at a time, never more
    assert "0/4 busy" in status  # `fleet status`: the node and its slots, none busy now
