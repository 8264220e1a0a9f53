"""Issue 36 on the real SkyPilot + Slurm: a node of 4 generic GPUs is 4 slots, one runner each.

The fixture's node declares `Gres=gpu:h100:4` (gres.conf names 4 empty files as the devices:
localsky.py), enough for Slurm and SkyPilot to schedule and count GPUs. A pool of one
`H100:4` cluster runs 8 experiments: 4 at a time, each with its own GPU index, through one
resident runner per GPU (each a SkyPilot job asking for one GPU). Reuses the session's
`local_sky` (conftest.py); its own lab and cluster, torn down at the end.
Run: `pytest -q tests/skypilot_real/test_gpu_slots_on_slurm.py` (as root; minutes).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from localsky import SLURM_CLUSTER, worker_yaml

from labkit import GIT_ENV, SYNTHETIC_TRAIN, commit, nightlab, wait_until

NODE = f"""
[[fleet.pool]]
backend = "skypilot"
tier = "h100"
accelerators = "H100:4"
workers = 1
infra = "slurm/{SLURM_CLUSTER}"
"""
SHOW = "echo lane gpu=$CUDA_VISIBLE_DEVICES index=$NIGHTLAB_GPU threads=$OMP_NUM_THREADS; python train.py"
SLEEP = 8  # seconds per run: long enough that four overlap on a loaded 2-core box


@pytest.fixture(scope="module")
def env(local_sky) -> dict[str, str]:
    return {**local_sky.environ(), **GIT_ENV}


@pytest.fixture(scope="module")
def lab(tmp_path_factory, env, local_sky):
    root = tmp_path_factory.mktemp("gpus")
    target = root / "target"
    target.mkdir()
    (target / "train.py").write_text(SYNTHETIC_TRAIN)
    lab = root / "lab"
    nightlab("init", str(lab), "--target", str(target), "--cpu-slots", "1", "--timeout", "120", cwd=root)
    toml = lab / "nightlab.toml"
    text = toml.read_text().replace('command = "python train.py"', f'command = "{SHOW}"', 1)
    toml.write_text(text.replace("[search]", NODE + "\n[search]"))
    (lab / "fleet").mkdir(exist_ok=True)
    (lab / "fleet" / "skypilot.yaml").write_text(worker_yaml(local_sky.base))
    commit(lab, "one 4-GPU node")
    yield lab
    nightlab("fleet", "stop", cwd=lab, check=False, env=env)
    nightlab("fleet", "down", cwd=lab, check=False, env=env, timeout=600)


def _cli(lab: Path, env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return nightlab(*args, cwd=lab, env=env, timeout=timeout)


@pytest.mark.timeout(1800)  # minutes on a loaded 2-core box: a launch with set-up, then 8 runs
def test_a_4_gpu_node_runs_8_experiments_4_at_a_time_each_on_its_own_gpu(lab, env):
    from nightlab.ledger import open_ledger

    up = _cli(lab, env, "fleet", "up", "--json", timeout=1200)
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
