"""How long one successive-halving review takes as a screening rung fills up (issue 34, item 2).

The controller reviews a rung after every ok run that ends on it (`Judge.ended` ->
`nightlab.rungs.review`), on its main loop: a review that grows with candidates x runs would,
over a night of cheap screening runs, leave the controller behind its workers. This grows one
lab's rung through the real CLI and ledger API (one screening wave per 250 ideas, `--screen`'s
spec, each idea run once and ended through the ledger, all behind the incumbent so none is
promoted), then times `review` at each size, median of 3, wall and CPU seconds of this process.

Before/after: run it under each version (`PYTHONPATH=/path/to/old/src .venv/bin/python
bench/rung_review.py`); the lab is grown with the version that runs it.

Usage: .venv/bin/python bench/rung_review.py [--sizes 250,1000,2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def grow(lab: object, ideas: int, start: int) -> None:
    """Queue `ideas` new screening candidates on `cpu` and end each once, behind the incumbent."""
    from nightlab import rungs, waves

    for first in range(start, start + ideas, 250):
        configs = [{"LR": f"{0.0001 * (i + 1):.6f}"} for i in range(first, min(start + ideas, first + 250))]
        waves.submit_wave(
            lab,
            configs,
            design="full",
            description="screen",
            tier="cpu",
            spec=rungs.screen_spec("cpu", 2),
            start_controller=False,
        )
        while (attempt := lab.ledger.lease_next("cpu-0", "cpu")) is not None:
            n = int(attempt.experiment_id.lstrip("e"))
            value = 1.5 + (n % 997) / 1000  # behind the incumbent's 1.0 (a wave re-measures it too)
            if lab.ledger.get(attempt.experiment_id).identity == lab.head_identity():
                value = 1.0
            lab.ledger.finish_attempt(attempt.id, outcome="ok", exit_code=0, metrics={"val_bpb": value})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="250,1000,2000")
    args = parser.parse_args()
    from nightlab import rungs
    from nightlab.lab import Lab
    from nightlab.testing import reliability as rel

    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.1f}")
    root = Path(tempfile.mkdtemp(prefix="nightlab-rungs-"))
    target = root / "target"
    target.mkdir()
    (target / "train.py").write_text("LR = 0.01\nprint('---')\nprint('val_bpb: 1.0')\n")
    init = ["init", str(root / "lab"), "--target", str(target), "--command", "python train.py"]
    rel.nightlab(*init, "--editable", "train.py", "--cpu-slots", "1", cwd=root)
    with Lab.open(root / "lab") as lab:
        from nightlab import waves

        waves.noise(lab, repeats=2, tier="cpu", start_controller=False)  # the incumbent, on the rung
        while (attempt := lab.ledger.lease_next("cpu-0", "cpu")) is not None:
            lab.ledger.finish_attempt(attempt.id, outcome="ok", exit_code=0, metrics={"val_bpb": 1.0})
        have = 0
        print("| candidates on the rung | review: wall s | review: CPU s |")
        print("| --- | --- | --- |")
        for size in (int(s) for s in args.sizes.split(",")):
            grow(lab, size - have, have)
            have = size
            walls, cpus = [], []
            for _ in range(3):
                w, c = time.perf_counter(), time.process_time()
                rungs.review(lab, "cpu")
                walls.append(time.perf_counter() - w)
                cpus.append(time.process_time() - c)
            print(f"| {size} | {statistics.median(walls):.3f} | {statistics.median(cpus):.3f} |", flush=True)


if __name__ == "__main__":
    main()
