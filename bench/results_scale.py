"""How `nightlab results` and the dashboard's first load grow with the ledger (issue 16).

Grows a lab through the real ledger API (`bench/reliability.py`'s `_grow`: add, lease and
finish each experiment, 10% crashes) to each size, then times, in-process, median of 3:

    results            the table (15 rows)
    results --json     every experiment (the whole document, ~0.5 KB a row)
    results --json -n 25
    dashboard /        the overview page right after a new ledger event (its cache is cold)
    /api/results       the dashboard's copy of `results --json`
    /api/progress      the overview's chart (every ok run as a point), fetched by the first load

Each figure is wall seconds and CPU seconds of this process: on a shared 2-core box the wall
time mostly measures the other processes, the CPU time what the code costs.

Before/after on one ledger: grow once with `--keep DIR`, then run with `--lab DIR/big` under
each version (`PYTHONPATH=/path/to/old/src .venv/bin/python bench/results_scale.py --lab ...`).

Usage: .venv/bin/python bench/results_scale.py [--sizes 1000,5000,20000] [--keep DIR] [--lab DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def measure(fn, repeat: int = 3) -> tuple[float, float]:
    """Median wall and CPU seconds of `fn()` over `repeat` calls."""
    walls, cpus = [], []
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus)


def cli(lab: Path, *args: str) -> None:
    from nightlab.cli import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main([*args, "--lab", str(lab)])
        except SystemExit as e:
            if e.code not in (0, None):
                raise RuntimeError(f"nightlab {' '.join(args)} exited {e.code}") from None


def figures(lab: Path) -> dict[str, tuple[float, float]]:
    from fastapi.testclient import TestClient

    from nightlab.ledger import open_ledger
    from nightlab.web import create_app

    out = {
        "`results` (table)": measure(lambda: cli(lab, "results")),
        "`results --json`": measure(lambda: cli(lab, "results", "--json")),
    }
    try:
        out["`results --json -n 25`"] = measure(lambda: cli(lab, "results", "--json", "-n", "25"))
    except RuntimeError:
        pass  # a version whose --json ignores -n: nothing to compare
    with TestClient(create_app(lab)) as client:

        def cold() -> None:
            with open_ledger(lab) as ledger:
                ledger.log_event("bench")  # a new ledger version: the overview is recomputed
            assert client.get("/").status_code == 200

        out["dashboard `/` (cold)"] = measure(cold)
        out["dashboard `/` (cached)"] = measure(lambda: client.get("/"))

        def api_results() -> None:
            with open_ledger(lab) as ledger:
                ledger.log_event("bench")
            assert client.get("/api/results").status_code == 200

        out["`/api/results` (cold)"] = measure(api_results)

        def api_progress() -> None:
            with open_ledger(lab) as ledger:
                ledger.log_event("bench")
            assert client.get("/api/progress").status_code == 200

        out["`/api/progress` (cold: the overview's chart)"] = measure(api_progress)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,5000,20000")
    parser.add_argument("--keep", type=Path, default=None, help="grow the lab here and leave it")
    parser.add_argument("--lab", type=Path, default=None, help="time this grown lab only (no growing)")
    args = parser.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.1f}")
    table: dict[str, list[str]] = {}
    if args.lab is not None:
        sizes = ["this lab"]
        for k, (w, c) in figures(args.lab.resolve()).items():
            table.setdefault(k, []).append(f"{w:.2f} / {c:.2f}")
    else:
        import reliability as bench
        from nightlab.ledger import open_ledger
        from nightlab.testing import reliability as rel

        sizes = [int(s) for s in args.sizes.split(",")]
        root = args.keep or Path(tempfile.mkdtemp(prefix="nightlab-scale-"))
        root.mkdir(parents=True, exist_ok=True)
        lab = rel.make_fast_lab(root, name="big", slots=8)
        try:
            [first] = rel.submit_many(lab, 1)
            with open_ledger(lab) as ledger:
                e = ledger.get(first)
            for size in sizes:
                with open_ledger(lab) as ledger:
                    bench._grow(lab, ledger, size, e.snapshot, e.identity)
                for k, (w, c) in figures(lab).items():
                    table.setdefault(k, []).append(f"{w:.2f} / {c:.2f}")
                print(f"  {size} done", file=sys.stderr)
        finally:
            rel.stop_lab(lab)
            if args.keep is None:
                import shutil

                shutil.rmtree(root, ignore_errors=True)
    print(f"\n| measure (wall / CPU s) | {' | '.join(str(s) for s in sizes)} |")
    print("|---|" + "---|" * len(sizes))
    for k, v in table.items():
        print(f"| {k} | {' | '.join(v)} |")


if __name__ == "__main__":
    main()
