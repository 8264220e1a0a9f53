"""Fleet overhead: how much of the slots' time goes to running targets.

8 CPU slots, 400 experiments of a synthetic target that sleeps 1 s (a shell script, so
interpreter start-up does not blur the figure). The target prints its own start and end
time; from those:

    utilisation      = sum(target run time) / (slots x wall time from first start to last end)
    dispatch latency = start of an experiment's process - end of the previous one on that slot
                       (all experiments are queued before the fleet starts)

Goal (issue 2): utilisation >= 0.95, median dispatch latency <= 100 ms.
Usage: .venv/bin/python bench/fleet_overhead.py [--slots 8] [--experiments 400] [--sleep 1.0]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _cli import nightlab  # bench/_cli.py (the script's folder is on sys.path)

TARGET = """\
START=$(date +%s.%N)
SLEEP=1.0  # seconds of "training"
sleep $SLEEP
echo ---
echo "val_bpb: 1.0"
echo "start_ts: $START"
echo "end_ts: $(date +%s.%N)"
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--experiments", type=int, default=400)
    parser.add_argument("--sleep", type=float, default=1.0)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="nightlab-bench-") as tmp:
        root = Path(tmp)
        target = root / "target"
        target.mkdir()
        (target / "train.sh").write_text(TARGET.replace("SLEEP=1.0", f"SLEEP={args.sleep}"))
        lab = root / "lab"
        nightlab(
            "init",
            str(lab),
            "--target",
            str(target),
            "--editable",
            "train.sh",
            "--command",
            "sh train.sh",
            "--cpu-slots",
            str(args.slots),
            # the target sleeps: more slots than cores measure the fleet, not the CPU (fleet/health.py)
            "--oversubscribe",
            cwd=root,
        )
        nightlab("submit", "-m", "overhead", "--repeats", str(args.experiments), "--no-start", cwd=lab)
        t0 = time.time()
        nightlab("fleet", "start", cwd=lab)
        nightlab("wait", "--all", "--timeout", str(args.experiments * args.sleep * 2 + 120), cwd=lab)
        elapsed = time.time() - t0
        nightlab("fleet", "stop", cwd=lab)

        from nightlab.ledger import open_ledger

        with open_ledger(lab) as ledger:
            exps = ledger.experiments()
            runs = []
            for e in exps:
                if not e.ok:
                    sys.exit(f"{e.id} ended {e.outcome}: {e.detail}")
                worker = ledger.attempts(e.id)[-1].worker
                runs.append((worker, e.metrics["start_ts"], e.metrics["end_ts"]))
    busy = sum(end - start for _, start, end in runs)
    wall = max(end for *_, end in runs) - min(start for _, start, _ in runs)
    utilisation = busy / (args.slots * wall)
    latencies = []
    for worker in {w for w, *_ in runs}:
        mine = sorted((s, e) for w, s, e in runs if w == worker)
        latencies += [b[0] - a[1] for a, b in zip(mine, mine[1:], strict=False)]
    latencies.sort()
    median = statistics.median(latencies)
    p95 = latencies[int(0.95 * (len(latencies) - 1))]
    print(f"slots {args.slots}, experiments {args.experiments}, target sleep {args.sleep:.1f} s")
    print(
        f"wall time (first start to last end) {wall:.1f} s; ideal {args.experiments * args.sleep / args.slots:.1f} s;"
        f" fleet start to all recorded {elapsed:.1f} s"
    )
    print(f"{'metric':<26}{'measured':>12}{'goal':>10}")
    print(f"{'utilisation':<26}{utilisation:>12.3f}{'>= 0.95':>10}")
    print(f"{'median dispatch latency':<26}{median * 1000:>10.1f}ms{'<= 100ms':>10}")
    print(f"{'p95 dispatch latency':<26}{p95 * 1000:>10.1f}ms")


if __name__ == "__main__":
    main()
