"""Benchmark: server time of the dashboard's pages on big ledgers (target: overview < 300 ms at 5,000).

Builds labs whose ledgers hold N finished experiments (5 % crashed, 10 waves, 9 metrics
each, a few kept), two running and three queued, then times each page in-process through
FastAPI's TestClient (routing, ledger reads, git calls, template rendering; no network):
the median and the 90th percentile of repeated requests, side by side for each size.
"cold" rows are the first request after a ledger change (the bench logs an event before
each), when the page data must be recomputed; the other rows are served from the
dashboard's per-version cache, as every request is until the ledger changes again.

Usage:
    .venv/bin/python bench/dashboard.py                 # sizes 500 and 5000
    .venv/bin/python bench/dashboard.py --sizes 5000 --repeats 30
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = "LR = 0.01\nprint('---')\nprint('val_bpb: 1.0')\n"
BUDGET_MS = 300.0


def build_lab(root: Path, n: int) -> Path:
    """A lab whose ledger holds `n` finished experiments (written directly, as a controller would)."""
    from nightlab.lab import InitOptions, init_lab
    from nightlab.ledger import ExperimentStatus, NewExperiment, open_ledger

    target = root / "target"
    target.mkdir()
    (target / "train.py").write_text(TARGET)
    lab = init_lab(root / "lab", InitOptions(target=target, cpu_slots=2))
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=lab, capture_output=True, text=True
    ).stdout.strip()
    tree = subprocess.run(
        ["git", "rev-parse", "HEAD^{tree}"], cwd=lab, capture_output=True, text=True
    ).stdout.strip()
    rng = random.Random(0)
    with open_ledger(lab) as ledger:
        waves = [
            ledger.add_wave(design="full", description=f"wave {i}", spec={"factors": ["LR"]})
            for i in range(10)
        ]
        new = []
        for i in range(n + 5):
            own_tree = tree if i < 3 else f"{i:040x}"  # the first three measure the incumbent
            new.append(
                NewExperiment(
                    snapshot=f"{i + 1:040x}" if i >= 3 else head,
                    identity=own_tree,
                    parent=head,
                    description=f"idea {i}: try LR {0.01 + i * 1e-5:.5f} with a longer description of the change",
                    tier="cpu",
                    seed=i % 3,
                    wave=waves[i % 10].id if i % 4 == 0 else None,
                    params={"LR": f"{0.01 + (i % 2) * 0.01:.2f}"},
                )
            )
        exps = ledger.add_experiments(new)
        now = time.time()
        with ledger.transaction() as c:
            for k, e in enumerate(exps[:n]):
                start = now - (n - k) * 30.0
                crashed = rng.random() < 0.05
                outcome = "crash:exception" if crashed else "ok"
                verdict = (
                    "crash" if crashed else ("baseline" if k < 3 else ("keep" if k % 97 == 0 else "discard"))
                )
                c.execute(
                    "UPDATE experiments SET status = ?, outcome = ?, verdict = ?, attempts = 1,"
                    " started_at = ?, finished_at = ? WHERE id = ?",
                    (int(ExperimentStatus.FINISHED), outcome, verdict, start, start + 25.0, e.id),
                )
                c.execute(
                    "INSERT INTO attempts (experiment_id, number, worker, started_at, heartbeat_at, ended_at,"
                    " exit_code, failure) VALUES (?, 1, ?, ?, ?, ?, ?, ?)",
                    (e.id, f"cpu-{k % 2}", start, start + 25.0, start + 25.0, 1 if crashed else 0, outcome),
                )
                if not crashed:
                    metrics = {
                        "val_bpb": 1.0 - k * 1e-5 + rng.gauss(0, 0.002),
                        "training_seconds": 20.0,
                        "total_seconds": 25.0,
                        "peak_vram_mb": 2048.0,
                        "mfu_percent": 40.0,
                        "total_tokens_M": 1.0,
                        "num_steps": 100.0,
                        "num_params_M": 0.5,
                        "depth": 4.0,
                    }
                    for key, value in metrics.items():
                        c.execute(
                            "INSERT INTO metrics (experiment_id, key, value) VALUES (?, ?, ?)",
                            (e.id, key, value),
                        )
        ledger.register_workers([(f"cpu-{i}", "cpu", "local", {"threads": 1}) for i in range(2)])
        for worker in ("cpu-0", "cpu-1"):
            ledger.lease_next(worker, "cpu")
    return lab


def _summary(samples: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Median and 90th percentile of the wall times, median of the CPU times (all in ms)."""
    walls = sorted(w for w, _ in samples)
    return (
        statistics.median(walls),
        walls[int(0.9 * (len(walls) - 1))],
        statistics.median(c for _, c in samples),
    )


def _timed_get(client, path: str) -> tuple[float, float]:
    # CPU time of the whole process: the request runs in TestClient's worker thread, and on a
    # shared machine it is the figure an unloaded core would show as wall time
    w0, c0 = time.perf_counter(), time.process_time()
    assert client.get(path).status_code < 400, path
    return (time.perf_counter() - w0) * 1000, (time.process_time() - c0) * 1000


def time_requests(client, path: str, repeats: int) -> tuple[float, float, float]:
    """`_summary` of `repeats` GETs after one warm-up (caches warm)."""
    _timed_get(client, path)
    return _summary([_timed_get(client, path) for _ in range(repeats)])


def time_cold(client, lab: Path, path: str, repeats: int) -> tuple[float, float, float]:
    """The same for the first request after a change to the ledger (an event): nothing cached."""
    from nightlab.ledger import open_ledger

    samples = []
    with open_ledger(lab) as ledger:
        for _ in range(repeats):
            ledger.log_event("bench-touch")
            samples.append(_timed_get(client, path))
    return _summary(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 5000], help="ledger sizes to compare")
    parser.add_argument("--repeats", type=int, default=20, help="timed requests per page")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args()

    from fastapi.testclient import TestClient

    from nightlab.web._readonly import ReadOnlyLab
    from nightlab.web.app import create_app

    figures: dict[int, dict[str, tuple[float, float, float]]] = {}
    for n in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            lab = build_lab(Path(tmp), n)
            print(f"built a ledger of {n} experiments in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            with ReadOnlyLab(lab) as ro:
                version = ro.version()
            cold = {
                "overview (/), cold": "/",
                "progress chart data, cold": "/api/progress",
            }
            pages = {
                "overview (/)": "/",
                "overview live update": "/?partial=1",
                "overview unchanged (204)": f"/?partial=1&since={version}",
                "progress chart data": "/api/progress",
                "/api/overview": "/api/overview",
                "fleet": "/fleet",
                "experiment page": "/experiments/e0005",
                "waves": "/waves",
                "wave w001 (effects)": "/waves/w001",
            }
            with TestClient(create_app(lab)) as client:
                figures[n] = {name: time_cold(client, lab, path, args.repeats) for name, path in cold.items()}
                figures[n].update(
                    (name, time_requests(client, path, args.repeats)) for name, path in pages.items()
                )

    width = 34
    header = f"{'page':<26}" + "".join(f"{f'{n} exps: wall med / p90 | cpu':>{width}}" for n in args.sizes)
    print()
    print(header)
    print("-" * len(header))
    for name in figures[args.sizes[0]]:
        cells = ""
        for n in args.sizes:
            med, p90, cpu = figures[n][name]
            cells += f"{f'{med:.1f} / {p90:.1f} | {cpu:.1f} ms':>{width}}"
        print(f"{name:<26}{cells}")
    big = max(args.sizes)
    print()
    for name in ("overview (/), cold", "overview (/)"):
        med, p90, cpu = figures[big][name]
        verdict = "PASS" if cpu < BUDGET_MS else "FAIL"
        print(
            f"{name} at {big} experiments: cpu {cpu:.1f} ms (wall p90 {p90:.1f} ms on this machine's load)"
            f" vs budget {BUDGET_MS:.0f} ms -> {verdict}"
        )
    if args.json:
        print(json.dumps({str(n): f for n, f in figures.items()}))


if __name__ == "__main__":
    main()
