"""Overhead between waves of `nightlab search`: from the last run of a wave ending to the first run
of the next one starting, with 16 and 64 workers.

The real lab runs bench/search_sim.py's target (a shell script plus awk, sleeping `--run` seconds
per run) on 16 or 64 local CPU slots, through `search_loop.run_search` (the code behind
`nightlab search`) with waves as wide as the fleet. For each pair of consecutive waves the gap is

    gap = first start of wave i+1 (the target's own clock) - last end of wave i (the target's own clock)

and it is split, from timers around the loop's parts, into: noticing the end (the controller
records the run, the loop's wait polls the ledger), judging (best of wave, noise floor, settle
decision), adopting (git), proposing (the strategy), snapshots and queueing (one git snapshot and
one ledger row per proposal), and dispatch (the controller leasing the first run and starting its
process). Settle rounds are runs of the wave: a wave ends with its last settle run.

Goal (issue 17): <= 1 s at 16 workers. Figures go to bench/RESULTS.md.

The controller starts a wave's first run as soon as it is queued, so the gap holds only the first
snapshot; `all queued` is the time to queue every run of the next wave.

Usage: .venv/bin/python bench/search_overhead.py [--workers 16,64] [--waves 5] [--run 1.0] [--strategy surface]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from _cli import nightlab  # bench/_cli.py (the script's folder is on sys.path)
from search_sim import SPACES, make_lab


def measure(root: Path, *, workers: int, waves: int, run: float, strategy: str, poll: float) -> dict:
    """Run one search on `workers` slots; per gap between waves: its total and its parts (seconds)."""
    from nightlab import search_loop
    from nightlab.lab import Lab
    from nightlab.search import strategies

    timers: dict[str, list[tuple[float, float]]] = defaultdict(list)

    def timed(name, fn):
        def wrapper(*a, **kw):
            t0 = time.time()
            try:
                return fn(*a, **kw)
            finally:
                timers[name].append((t0, time.time()))

        return wrapper

    originals = {n: getattr(search_loop._LabLoop, n) for n in ("submit", "wait", "decide", "adopt")}
    for n, fn in originals.items():
        setattr(search_loop._LabLoop, n, timed(n, fn))
    make = strategies.make_strategy

    def make_timed(*a, **kw):
        s = make(*a, **kw)
        s.propose = timed("propose", s.propose)
        return s

    strategies.make_strategy = make_timed  # run_search imports it from there at call time
    lab_dir = make_lab(root, f"overhead-{workers}", slots=workers, seed=0, run=run)
    try:
        with Lab(lab_dir) as lab:
            search_loop.run_search(
                lab, strategy=strategy, spaces=SPACES, waves=waves, wave_size=workers, seed=0, poll=poll
            )
            search_waves = [w for w in lab.ledger.waves() if lab.ledger.search_progress(w.id)]
            runs = {w.id: lab.ledger.experiments(wave=w.id) for w in search_waves}
    finally:
        for n, fn in originals.items():
            setattr(search_loop._LabLoop, n, fn)
        strategies.make_strategy = make
        nightlab("fleet", "stop", cwd=lab_dir)

    def ends(exps):
        return [e.metrics.get("end_ts") or e.finished_at for e in exps if e.finished_at]

    def starts(exps):
        return [e.metrics.get("start_ts") or e.started_at for e in exps if e.started_at]

    gaps = []
    for a, b in zip(search_waves, search_waves[1:], strict=False):
        # the first wave also holds the noise floor's repeats (submitted under no wave): its end is
        # the end of the wave's runs, which the loop waited for
        last_end = max(ends(runs[a.id]))
        first_start = min(starts(runs[b.id]))
        recorded = max(e.finished_at for e in runs[a.id] if e.finished_at)

        def within(name, lo=last_end, hi=first_start):
            return sum(min(t1, hi) - max(t0, lo) for t0, t1 in timers[name] if t1 > lo and t0 < hi)

        submit_start, submit_end = next((t0, t1) for t0, t1 in timers["submit"] if t0 >= last_end)
        wait_end = next(t1 for t0, t1 in timers["wait"] if t1 >= recorded)
        gaps.append(
            {
                "gap": first_start - last_end,
                "notice": wait_end - last_end,  # controller records the end, the loop's poll sees it
                "judge": within("decide"),
                "adopt": within("adopt"),
                "propose": within("propose"),
                "snapshots": within("submit"),
                "dispatch": max(0.0, first_start - submit_end),
                "runs_next": len(runs[b.id]),
                "submit_all": submit_end - submit_start,  # every snapshot of the next wave queued
            }
        )
    return {"workers": workers, "gaps": gaps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="16,64")
    parser.add_argument("--waves", type=int, default=5)
    parser.add_argument("--run", type=float, default=1.0, help="seconds of a run at DEPTH 10")
    parser.add_argument(
        "--strategy",
        default="surface",
        help="factorial fills 64 workers; surface proposes ~30 runs for 8 knobs",
    )
    parser.add_argument(
        "--poll", type=float, default=0.05, help="the loop's ledger poll (nightlab search: 0.05 s)"
    )
    args = parser.parse_args()
    parts = ["notice", "judge", "adopt", "propose", "snapshots", "dispatch"]
    with tempfile.TemporaryDirectory(prefix="nightlab-search-overhead-") as tmp:
        for w in (int(x) for x in args.workers.split(",")):
            result = measure(
                Path(tmp), workers=w, waves=args.waves, run=args.run, strategy=args.strategy, poll=args.poll
            )
            gaps = result["gaps"]
            print(f"{w} workers, {args.strategy}, {len(gaps)} gaps between {args.waves} waves:")
            for g in gaps:
                print(
                    f"  gap {g['gap']:.2f} s = "
                    + ", ".join(f"{p} {g[p]:.2f}" for p in parts)
                    + f" (next wave {g['runs_next']} runs, all queued in {g['submit_all']:.2f} s)"
                )
            med = {p: statistics.median(g[p] for g in gaps) for p in ["gap", *parts]}
            print(
                f"  median gap {med['gap']:.2f} s: " + ", ".join(f"{p} {med[p]:.2f}" for p in parts),
                flush=True,
            )


if __name__ == "__main__":
    main()
