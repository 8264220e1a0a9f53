"""Fleet efficiency on the real path: the real SkyPilot on a local Slurm cluster, runner against `sky exec`.

2 SkyPilot workers (`infra = "slurm/localslurm"`, the cluster of tests/skypilot_real/localsky.py),
N experiments of a synthetic target that sleeps S seconds and reports `training_seconds: S`.
The clusters are launched once; then the same batch runs on them once per `--modes` value, side
by side: `runner` (the default on Slurm: one resident runner job per cluster, started by
`fleet up` before the batch, fed two experiments ahead), `exec:true` (`runner = false`: one
`sky exec` per experiment, two queued on each cluster's job queue behind the one that runs),
`exec:false` (`sky exec` only once the previous run has been recorded), or `exec:<depth>`.
Each batch prints one JSON line, with the load average (1 min) before and after it.

    efficiency = sum(training seconds) / worker-held seconds
    worker-held = workers x (last experiment's end - first lease) of the batch

`efficiency_from_first_start` counts each worker from its first job's start instead, leaving
out the batch's first `sky exec` (paid once per batch, however long the batch).

The gap per run is the time a worker held no running experiment between two runs (job start
from `run_dir/sky.json`, end from the ledger). Goal (issue 14): efficiency >= 0.95 pipelined.

Where a worker's held time goes (`breakdown`, medians per run; each worker's runs in start order):
`in_run_s` = `nightlab-start:` -> `nightlab-end:` (the command) minus its training seconds;
`handover_s` = one command's end -> the next one's `nightlab-start:` on the same worker, split
into `post_s` (command end -> SkyPilot's end of its job: the run script's code hash, the job step
and driver ending), `skypilot_s` (that job's end -> SkyPilot's start of the next one: the next
job step created, its executor started) and `pre_s` (-> `nightlab-start:`: the run script's
unpacking, GPU probe and run lock); per batch: `first_start_s` (the first lease -> each worker's
first start: its first `sky exec`, mean), `record_s` (the last command's end -> its end in the
ledger) and `idle_end_s` (a worker that finished before the other, mean).

Usage (as root, like the tests; brings up and tears down the local cluster):
    .venv/bin/python bench/fleet_real.py [--runs 12] [--seconds 60] [--modes exec:true runner]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "skypilot_real"))

from _cli import nightlab  # noqa: E402  (bench/_cli.py: the script's folder is on sys.path)
from localsky import LocalSky, add_pool  # noqa: E402

TARGET = '''\
"""Bench target: S seconds of "training", then the summary block."""
import time

SLEEP = 60.0  # seconds of "training"

time.sleep(SLEEP)
print("---")
print("val_bpb: 1.0")
print(f"training_seconds: {SLEEP:.1f}")
'''


def git(lab: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=lab, check=True, capture_output=True)


def batch(
    lab: Path, env: dict[str, str], *, mode: str, runs: int, seconds: float, seed0: int
) -> dict[str, object]:
    """Submit `runs` experiments, run them on the two clusters in `mode` (module docstring), measure."""
    from nightlab.ledger import open_ledger

    runner = mode == "runner"
    pipeline = "true" if runner else mode.removeprefix("exec:")
    toml = lab / "nightlab.toml"
    text = re.sub(r"(?m)^pipeline = .*$", f"pipeline = {pipeline}", toml.read_text())
    toml.write_text(re.sub(r"(?m)^runner = .*$", f"runner = {str(runner).lower()}", text))
    git(lab, "commit", "-qam", f"mode {mode}", "--allow-empty")
    if runner:  # what a user does: `fleet up` starts each cluster's runner before the batch
        t = time.time()
        nightlab("fleet", "up", "--json", cwd=lab, env=env, timeout=1800)
        print(f"fleet up (runners) in {time.time() - t:.0f} s", file=sys.stderr)
    load_before = os.getloadavg()[0]
    ids = []
    for i in range(runs):
        out = nightlab(
            "submit", "-m", f"run {i}", "--tier", "slurm", "--set", f"SLEEP={seconds}",
            "--seed", str(seed0 + i),  # the same snapshot: a new seed per run is a new measurement
            "--no-start", "--json", cwd=lab, env=env, timeout=300,
        )  # fmt: skip
        ids.append(json.loads(out)[0]["id"])
    nightlab("fleet", "start", cwd=lab, env=env, timeout=300)
    deadline = time.time() + runs * (seconds + 120)
    while time.time() < deadline:
        with open_ledger(lab) as ledger:
            exps = [ledger.get(i) for i in ids]
        if all(e.status.is_finished() for e in exps):
            break
        time.sleep(2)
    nightlab("fleet", "stop", cwd=lab, env=env, timeout=300)
    sky_jobs = _sky_jobs(lab, env)
    with open_ledger(lab) as ledger:
        exps = {e.id: e for e in ledger.experiments(with_metrics=True) if e.id in ids}
        tries = [a for i in ids for a in ledger.attempts(i)]
    outcomes = sorted({e.outcome or "?" for e in exps.values()})
    training = sum(float(e.metrics.get("training_seconds", 0.0)) for e in exps.values() if e.outcome == "ok")
    first, last = min(a.started_at for a in tries), max(a.ended_at or time.time() for a in tries)
    held = 2 * (last - first)
    gaps, runs_s, first_start, steady = [], [], [], 0.0
    parts: dict[str, list[float]] = {
        k: [] for k in ("in_run_s", "handover_s", "post_s", "skypilot_s", "pre_s")
    }
    worker_ends = []
    for worker in {a.worker for a in tries}:
        spans = []
        for a in tries:
            if a.worker != worker or a.ended_at is None:
                continue
            saved = json.loads((Path(a.log_path).with_name("sky.json")).read_text())
            job = sky_jobs.get(f"nightlab-{a.experiment_id}-a{a.number}", {})
            trained = float(exps[a.experiment_id].metrics.get("training_seconds", 0.0))
            spans.append(
                (
                    float(saved.get("started_at", a.started_at)),
                    a.ended_at,
                    saved.get("command_ended_at"),
                    job,
                    trained,
                )
            )
        spans.sort(key=lambda span: span[0])
        gaps += [b[0] - a[1] for a, b in zip(spans, spans[1:], strict=False)]
        runs_s += [span[1] - span[0] for span in spans]
        first_start.append(spans[0][0] - first)  # the first `sky exec` of the batch: paid once
        steady += max(span[1] for span in spans) - spans[0][0]
        worker_ends.append(max(span[1] for span in spans))
        for start, _, command_end, _, trained in spans:
            if command_end is not None:
                parts["in_run_s"].append(command_end - start - trained)
        for (_, _, end, job, _), (start, _, _, nxt, _) in zip(spans, spans[1:], strict=False):
            if end is None:
                continue
            parts["handover_s"].append(start - end)
            if job.get("end_at") and nxt.get("start_at"):
                parts["post_s"].append(job["end_at"] - end)
                parts["skypilot_s"].append(nxt["start_at"] - job["end_at"])
                parts["pre_s"].append(start - nxt["start_at"])
    ends = []
    for a in tries:
        if a.ended_at is not None and a.log_path:
            saved = json.loads((Path(a.log_path).with_name("sky.json")).read_text())
            if saved.get("command_ended_at"):
                ends.append((a.ended_at, float(saved["command_ended_at"])))
    last_command_end = max(ends)[1] if ends else last
    breakdown = {k: round(statistics.median(v), 2) if v else None for k, v in parts.items()}
    breakdown["first_start_s"] = round(statistics.mean(first_start), 1) if first_start else None
    breakdown["record_s"] = round(last - last_command_end, 2)
    breakdown["idle_end_s"] = (
        round(statistics.mean(last - e for e in worker_ends), 1) if worker_ends else None
    )
    return {
        "mode": mode,
        "pipeline": pipeline,
        "runs": runs,
        "seconds": seconds,
        "outcomes": outcomes,
        "attempts": len(tries),
        "training_s": training,
        "held_s": round(held, 1),
        "efficiency": round(training / held, 3) if held else 0.0,
        "median_gap_s": round(statistics.median(gaps), 1) if gaps else 0.0,
        "max_gap_s": round(max(gaps), 1) if gaps else 0.0,
        # job start to the ledger's end: the run itself plus what it does outside `training_seconds`
        "median_run_s": round(statistics.median(runs_s), 1) if runs_s else 0.0,
        "first_start_s": round(statistics.mean(first_start), 1) if first_start else 0.0,
        # the same, from each worker's first job start: what the batch's first `sky exec` leaves out
        "efficiency_from_first_start": round(training / steady, 3) if steady else 0.0,
        "breakdown": breakdown,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }


def _sky_jobs(lab: Path, env: dict[str, str]) -> dict[str, dict[str, float | None]]:
    """SkyPilot's own start and end of every job on the lab's clusters, by job name."""
    from nightlab.fleet.skypilot import cluster_name

    names = [cluster_name(lab, f"slurm-slurm-{i}") for i in range(2)]
    code = (
        "import json, sys, sky\n"
        "out = {}\n"
        "for name in sys.argv[1:]:\n"
        "    for j in sky.get(sky.queue(name, skip_finished=False)):\n"
        "        j = j if isinstance(j, dict) else j.model_dump()\n"
        "        out[j['job_name']] = {'start_at': j.get('start_at'), 'end_at': j.get('end_at')}\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *names],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        print(f"sky queue failed: {proc.stderr[-500:]}", file=sys.stderr)
        return {}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument(
        "--modes", nargs="+", default=["exec:true", "runner"],
        help="each batch's mode, run in this order: runner, or exec:<pipeline> (true = 2 queued, false = 0)",
    )  # fmt: skip
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
            nightlab("init", str(lab), "--target", str(target), "--cpu-slots", "1",
                     "--timeout", str(int(args.seconds) + 60), cwd=root, env=env)  # fmt: skip
            # the first batch's mode from the start: a runner that `fleet up` started would otherwise be
            # retired by an exec batch's controller first, and its cancel counted in that batch
            first_runner = str(args.modes[0] == "runner").lower()
            add_pool(lab, local.base, extra=f"pipeline = true\nrunner = {first_runner}\n")
            git(lab, "add", "-A")
            git(lab, "commit", "-qm", "bench pool")
            t = time.time()
            nightlab("fleet", "up", "--json", cwd=lab, env=env, timeout=1800)
            print(f"fleet up (2 clusters) in {time.time() - t:.0f} s", file=sys.stderr)
            try:
                for i, mode in enumerate(args.modes):
                    result = batch(lab, env, mode=mode, runs=args.runs, seconds=args.seconds, seed0=1000 * i)
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
