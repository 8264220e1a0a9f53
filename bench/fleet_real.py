"""Fleet efficiency on the real path: the real SkyPilot on a local Slurm cluster, with and without pipelining.

2 SkyPilot workers (`infra = "slurm/localslurm"`, the cluster of tests/skypilot_real/localsky.py),
N experiments of a synthetic target that sleeps S seconds and reports `training_seconds: S`.
The clusters are launched once; then the same batch runs twice on them: with the next
experiment queued on each cluster's job queue while one runs (`pipeline = true`, the default),
and without (`pipeline = false`: `sky exec` only once the previous run has been recorded).

    efficiency = sum(training seconds) / worker-held seconds
    worker-held = workers x (last experiment's end - first lease) of the batch

The gap per run is the time a worker held no running experiment between two runs (job start
from `run_dir/sky.json`, end from the ledger). Goal (issue 14): efficiency >= 0.95 pipelined.

Usage (as root, like the tests; brings up and tears down the local cluster):
    .venv/bin/python bench/fleet_real.py [--runs 12] [--seconds 60]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "skypilot_real"))

from localsky import SLURM_CLUSTER, LocalSky, worker_yaml  # noqa: E402

TARGET = '''\
"""Bench target: S seconds of "training", then the summary block."""
import time

SLEEP = 60.0  # seconds of "training"

time.sleep(SLEEP)
print("---")
print("val_bpb: 1.0")
print(f"training_seconds: {SLEEP:.1f}")
'''

POOL = f"""
[[fleet.pool]]
backend = "skypilot"
tier = "slurm"
workers = 2
infra = "slurm/{SLURM_CLUSTER}"
pipeline = true
"""


def nightlab(lab: Path, env: dict[str, str], *args: str, timeout: float = 300) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "nightlab", *args],
        cwd=lab,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise SystemExit(f"nightlab {' '.join(args)} failed: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def git(lab: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=lab, check=True, capture_output=True)


def batch(
    lab: Path, env: dict[str, str], *, pipelined: bool, runs: int, seconds: float, seed0: int
) -> dict[str, float]:
    """Submit `runs` experiments, run them on the two clusters, and measure the batch."""
    from nightlab.ledger import open_ledger

    toml = lab / "nightlab.toml"
    toml.write_text(
        toml.read_text().replace(
            f"pipeline = {str(not pipelined).lower()}", f"pipeline = {str(pipelined).lower()}"
        )
    )
    git(lab, "commit", "-qam", f"pipeline = {pipelined}", "--allow-empty")
    ids = []
    for i in range(runs):
        out = nightlab(
            lab,
            env,
            "submit",
            "-m",
            f"run {i}",
            "--tier",
            "slurm",
            "--set",
            f"SLEEP={seconds}",
            "--seed",
            str(seed0 + i),  # the same snapshot: a new seed per run is a new measurement
            "--no-start",
            "--json",
        )
        ids.append(json.loads(out)[0]["id"])
    nightlab(lab, env, "fleet", "start")
    deadline = time.time() + runs * (seconds + 120)
    while time.time() < deadline:
        with open_ledger(lab) as ledger:
            exps = [ledger.get(i) for i in ids]
        if all(e.status.is_finished() for e in exps):
            break
        time.sleep(2)
    nightlab(lab, env, "fleet", "stop")
    with open_ledger(lab) as ledger:
        exps = {e.id: e for e in ledger.experiments(with_metrics=True) if e.id in ids}
        tries = [a for i in ids for a in ledger.attempts(i)]
    outcomes = sorted({e.outcome or "?" for e in exps.values()})
    training = sum(float(e.metrics.get("training_seconds", 0.0)) for e in exps.values() if e.outcome == "ok")
    first, last = min(a.started_at for a in tries), max(a.ended_at or time.time() for a in tries)
    held = 2 * (last - first)
    gaps = []
    for worker in {a.worker for a in tries}:
        spans = []
        for a in tries:
            if a.worker != worker or a.ended_at is None:
                continue
            saved = json.loads((Path(a.log_path).with_name("sky.json")).read_text())
            spans.append((float(saved.get("started_at", a.started_at)), a.ended_at))
        spans.sort()
        gaps += [b[0] - a[1] for a, b in zip(spans, spans[1:], strict=False)]
    return {
        "pipelined": pipelined,
        "runs": runs,
        "outcomes": outcomes,
        "attempts": len(tries),
        "training_s": training,
        "held_s": held,
        "efficiency": training / held if held else 0.0,
        "median_gap_s": statistics.median(gaps) if gaps else 0.0,
        "max_gap_s": max(gaps) if gaps else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--only", choices=["pipelined", "plain"], default=None, help="run one batch only")
    args = parser.parse_args()
    local = LocalSky()
    started = time.time()
    try:
        local.up()
        print(f"local Slurm + SkyPilot up in {time.time() - started:.0f} s", file=sys.stderr)
        env = local.environ()
        with tempfile.TemporaryDirectory(prefix="nightlab-bench-sky-") as tmp:
            root = Path(tmp)
            target = root / "target"
            target.mkdir()
            (target / "train.py").write_text(TARGET)
            lab = root / "lab"
            nightlab(root, env, "init", str(lab), "--target", str(target), "--cpu-slots", "1",
                     "--timeout", str(int(args.seconds) + 60))  # fmt: skip
            toml = lab / "nightlab.toml"
            toml.write_text(toml.read_text().replace("[search]", POOL + "\n[search]"))
            (lab / "fleet").mkdir(exist_ok=True)
            (lab / "fleet" / "skypilot.yaml").write_text(worker_yaml(local.base))
            git(lab, "add", "-A")
            git(lab, "commit", "-qm", "bench pool")
            t = time.time()
            nightlab(lab, env, "fleet", "up", "--json", timeout=1800)
            print(f"fleet up (2 clusters) in {time.time() - t:.0f} s", file=sys.stderr)
            modes = [True, False] if args.only is None else [args.only == "pipelined"]
            try:
                for pipelined in modes:
                    result = batch(
                        lab,
                        env,
                        pipelined=pipelined,
                        runs=args.runs,
                        seconds=args.seconds,
                        seed0=0 if pipelined else 1000,
                    )
                    print(json.dumps(result), flush=True)
            finally:
                subprocess.run(
                    [sys.executable, "-m", "nightlab", "fleet", "stop"], cwd=lab, env=env, capture_output=True
                )
                subprocess.run(
                    [sys.executable, "-m", "nightlab", "fleet", "down"],
                    cwd=lab,
                    env=env,
                    capture_output=True,
                    timeout=900,
                )
    finally:
        local.down()
    print(f"total {time.time() - started:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
