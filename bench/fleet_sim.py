"""Benchmark: fleet efficiency of the SkyPilot backend, on the fake SDK with compressed time.

A 16-worker fleet (12 x H100 on "k8s", 4 x H200 elsewhere, the issue's example) runs
`--rounds` 5-minute experiments per worker through the real controller and the real
SkyPilot backend. Only the SDK's network calls are simulated (`nightlab.testing.fake_sky`),
with realistic latencies: cluster launch 3 min, set-up 2 min, `sky exec` 5 or 10 s to the
job being queued, 0.5 s per API request, job status polled every 5 s (the end of a job is
seen at once through its streamed log). Every duration is
multiplied by `--scale` (0.02: a 5-minute run takes 6 s), including the backend's polling
interval; the jobs run for real under bash, so Python start-up and thread scheduling are
*not* compressed, which makes the figures conservative.

Fleet efficiency = training seconds / held GPU seconds, over the window from the moment
every cluster is up to the last experiment's end (tail included). Two target profiles:
a target that trains from its first second, and one that spends 25 s per run on start-up
and evaluation around its 300 s of training, like autoresearch (`total_seconds` ~325).
The reference is the public autoresearch 16-GPU run: about 7 experiments per GPU-hour out
of 12 possible (0.58), agent thinking time included.

Usage:
    .venv/bin/python bench/fleet_sim.py                 # 16 workers, 6 rounds, scale 0.02 (~2.5 min)
    .venv/bin/python bench/fleet_sim.py --rounds 2 --scale 0.01
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from nightlab.config import load_config
from nightlab.fleet.controller import Controller
from nightlab.fleet.costs import worker_costs
from nightlab.fleet.skypilot import SkyPilotBackend, core, fleet_up, skypilot_slots
from nightlab.judge import Judge
from nightlab.lab import InitOptions, Lab, init_lab
from nightlab.ledger import ExperimentStatus, open_ledger
from nightlab.testing.fake_sky import FakeSky

TRAIN_SECONDS = 300.0  # the autoresearch budget
STATUS_INTERVAL = 5.0  # the backend's job-status poll (seconds, uncompressed)

TARGET = '''\
"""Simulated 5-minute training run: start-up, training, evaluation, summary."""
import time

SCALE = {scale}
STARTUP = {startup}  # seconds of start-up + evaluation around training (uncompressed)
time.sleep(STARTUP * SCALE / 2)
start = time.time()
time.sleep({train} * SCALE)
trained = time.time() - start
time.sleep(STARTUP * SCALE / 2)
print("---")
print("val_bpb:          1.000000")
print(f"training_seconds: {{trained:.4f}}")
'''

POOLS = """
[[fleet.pool]]
backend = "skypilot"
tier = "h100"
accelerators = "H100:1"
workers = {h100}
infra = "k8s"
autostop = 600

[[fleet.pool]]
backend = "skypilot"
tier = "h200"
accelerators = "H200:1"
workers = {h200}
autostop = 600
"""


def make_lab(root: Path, *, scale: float, startup: float, h100: int, h200: int) -> Path:
    repo = root / "target"
    repo.mkdir()
    (repo / "train.py").write_text(TARGET.format(scale=scale, startup=startup, train=TRAIN_SECONDS))
    lab = init_lab(
        root / "lab", InitOptions(target=repo, command="python train.py", cpu_slots=1, timeout=3600)
    )
    with open(lab / "nightlab.toml", "a") as f:
        f.write(POOLS.format(h100=h100, h200=h200))
    return lab


def run_fleet(
    *, scale: float, startup: float, h100: int, h200: int, rounds: int, exec_seconds: float
) -> dict:
    with tempfile.TemporaryDirectory(prefix="nightlab-fleet-sim-") as tmp:
        root = Path(tmp)
        lab = make_lab(root, scale=scale, startup=startup, h100=h100, h200=h200)
        fake = FakeSky(root / "clusters", scale=scale, exec_seconds=exec_seconds)
        # the backend's own waits are compressed like the fake's latencies
        core.STATUS_INTERVAL, core.RETRY_DELAY = STATUS_INTERVAL * scale, 2.0 * scale
        core.LOST_RELAUNCH_DELAY = 60.0 * scale
        # ---------------------------------------------------------------- fleet up
        t0 = time.time()
        clusters = fleet_up(lab, sdk=fake)
        up_seconds = time.time() - t0
        assert all(c["state"] == "up" for c in clusters), clusters
        # ---------------------------------------------------------------- a wave
        with Lab.open(lab) as opened:
            ids = [
                e.id
                for e in opened.submit(
                    "h100 runs", tier="h100", repeats=h100 * rounds, start_controller=False
                )
            ]
            ids += [
                e.id
                for e in opened.submit(
                    "h200 runs", tier="h200", repeats=h200 * rounds, start_controller=False
                )
            ]
        config = load_config(lab / "nightlab.toml")
        backend = SkyPilotBackend(config, lab_dir=lab, sdk=fake)
        slots = [s for p in config.fleet.pools if p.backend == "skypilot" for s in skypilot_slots(p)]
        holder: dict = {}

        def serve() -> None:
            with open_ledger(lab) as ledger:
                holder["controller"] = Controller(
                    lab,
                    config,
                    ledger,
                    slots=slots,
                    backends={"skypilot": backend},
                    policy=Judge(ledger, config, lab),
                )
                holder["controller"].run()

        thread = threading.Thread(target=serve, daemon=True)
        since = time.time()
        thread.start()
        with open_ledger(lab) as ledger:
            while not all(ledger.get(i).status == ExperimentStatus.FINISHED for i in ids):
                time.sleep(0.1)
            until = max(ledger.get(i).finished_at for i in ids)
            outcomes = {ledger.get(i).outcome for i in ids}
            holder["controller"].request_stop()
            thread.join(30)
            workers = worker_costs(ledger, since=since, until=until)
    held = sum(w.held_seconds for w in workers)
    training = sum(w.training_seconds for w in workers)
    runs = sum(w.experiments for w in workers)
    gpu_hours = held / scale / 3600
    return {
        "clusters": len(clusters),
        "runs": runs,
        "outcomes": sorted(outcomes),
        "up_minutes": up_seconds / scale / 60,
        "efficiency": training / held,
        "runs_per_gpu_hour": runs / gpu_hours,
        "overhead_per_run": (held - training) / runs / scale,
        "wall": time.time() - t0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--h100", type=int, default=12, help="H100 workers (clusters)")
    parser.add_argument("--h200", type=int, default=4, help="H200 workers (clusters)")
    parser.add_argument("--rounds", type=int, default=6, help="5-minute experiments per worker")
    parser.add_argument("--scale", type=float, default=0.02, help="time compression (0.02: 5 min -> 6 s)")
    args = parser.parse_args()
    n = args.h100 + args.h200
    print(
        f"{n} workers ({args.h100} H100 + {args.h200} H200), {args.rounds} rounds of 5-min runs, scale {args.scale}"
    )
    header = (
        f"{'configuration':<44} {'runs':>5} {'launch+setup':>13} {'efficiency':>10} {'runs/GPU-h':>10} "
        f"{'overhead/run':>13}"
    )
    print(header)
    print("-" * len(header))
    print(
        f"{'public autoresearch, 16 GPUs (reference)':<44} {'-':>5} {'-':>13} {7 / 12:>10.2f} {'7 of 12':>10}"
    )
    configs = (
        ("nightlab: trains at once, sky exec 5 s", 0.0, 5.0),
        ("nightlab: trains at once, sky exec 10 s", 0.0, 10.0),
        ("nightlab: 25 s start-up+eval/run, exec 10 s", 25.0, 10.0),
    )
    for label, startup, exec_seconds in configs:
        r = run_fleet(
            scale=args.scale,
            startup=startup,
            h100=args.h100,
            h200=args.h200,
            rounds=args.rounds,
            exec_seconds=exec_seconds,
        )
        print(
            f"{label:<44} {r['runs']:>5} {r['up_minutes']:>9.1f} min {r['efficiency']:>10.3f} "
            f"{r['runs_per_gpu_hour']:>10.2f} {r['overhead_per_run']:>11.1f} s"
            f"   (outcomes {','.join(r['outcomes'])}; {r['wall']:.0f} s wall)"
        )
    print(
        "max possible: 12 runs/GPU-h; efficiency counts every held second from all-up to the last run's end"
    )


if __name__ == "__main__":
    main()
