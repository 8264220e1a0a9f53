"""Search simulation: 1 worker running the greedy hill climb against 16 workers running each parallel strategy.

The target is a synthetic `train.py` whose metric is a known function of four knobs:

    lr_opt = 0.03 * 10 ** (0.5 * (WD - 0.1))                        (LR x WD interaction)
    metric = 0.9 + 2.0 (log10 LR - log10 lr_opt)^2 + 1.5 (WD - 0.1)^2
                 + 0.5 (WARMUP - 0.1)^2 + 0.004 (DEPTH - 8)^2 + noise (sd 0.003)

a narrow optimum in LR (a factor 2 off costs 0.18, sixty noise sds), a crash region (LR x DEPTH
> 0.6 prints a NaN failure), a run time that grows with DEPTH (0.6 + 0.05 DEPTH times the base),
and a second tier `fast` that runs 4x faster and scores 0.02 worse with twice the noise. Time is
compressed: a "5-minute" run sleeps `--run` seconds (0.3 by default).

The real lab runs it: `nightlab init`, the local fleet (the controller, 1 or 16 CPU slots), and
`research.run_search` (the same code as `nightlab search`), which measures the noise floor first.
Time is the target's own run time on the critical path: per wave, from its first run's start to
its last run's end (the target prints both), summed over the waves, noise floor included. The
loop's bookkeeping between waves (git snapshots, ledger) is left out: on real 5-minute runs it is
a rounding error, at 0.5 s it would dominate the sequential arm. Wall-clock seconds are printed too.

For each seed:
- greedy, 1 worker, `--budget` waves: its best true metric (the true metric of its final
  incumbent) is the target, and T_seq the time at which it first got there;
- each parallel strategy, 16 workers, waves of 16 (12 when screened), until it reaches that target (or runs out of
  `--max-waves`): T_par. Speed-up = T_seq / T_par.
- a wrong keep: an adoption whose true metric is worse than the incumbent it replaced.

Goal (issue 4): with 16 workers, >= 12x (the public 16-GPU run: about 9x) and no wrong keep in 20
seeded runs.

Usage: .venv/bin/python bench/search_sim.py [--seeds 20] [--run 0.3] [--budget 60] [--strategies factorial,optuna]
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# --- the synthetic target ----------------------------------------------------------------------

TRUTH = """\
def true_metric(LR, WD, WARMUP, DEPTH, BETA2, MLP_RATIO, EMBED_LR, CLIP):
    lr_opt = 0.02 * 10 ** (1.5 * (WD - 0.2)) * (10 / DEPTH) ** 0.5
    return (
        0.9
        + 1.5 * (math.log10(LR) - math.log10(lr_opt)) ** 2
        + 3.0 * (WD - 0.2) ** 2
        + 1.0 * (WARMUP - 0.1) ** 2
        + 0.003 * (DEPTH - 10) ** 2
        + 4.0 * (BETA2 - 0.95) ** 2
        + 0.01 * (MLP_RATIO - 4) ** 2
        + 0.3 * (math.log10(EMBED_LR) - math.log10(0.2)) ** 2
        + 0.05 * (CLIP - 1.0) ** 2
    )
"""

TRAIN = f'''\
"""Synthetic target for bench/search_sim.py: the metric is a known function of the knobs."""
import math
import os
import random
import sys
import time

LR = 0.002  # learning rate (log scale); its optimum moves with WD and DEPTH
WD = 0.0  # weight decay
WARMUP = 0.4  # warmup fraction
DEPTH = 4  # layers: better up to 10, slower always
BETA2 = 0.8  # Adam beta2
MLP_RATIO = 1  # MLP width / model width
EMBED_LR = 0.01  # embedding learning rate (log scale)
CLIP = 0.0  # gradient clipping norm
SIM_SEED = 0  # the simulation's seed
RUN = 0.5  # seconds of a "5-minute" run at DEPTH 10 on the base tier
NOISE = 0.003  # sd of the run-to-run noise

{TRUTH}
start = time.time()
fast = os.environ.get("NIGHTLAB_TIER") == "fast"
time.sleep(RUN * (0.5 + 0.05 * DEPTH) * (0.25 if fast else 1.0))
if LR * DEPTH > 0.8:
    print("FAIL: loss is nan at step 40")
    sys.exit(1)
knobs = (LR, WD, WARMUP, DEPTH, BETA2, MLP_RATIO, EMBED_LR, CLIP)
key = f"{{SIM_SEED}}|{{os.environ.get('NIGHTLAB_SEED', '0')}}|{{knobs!r}}|{{fast}}"
noise = random.Random(key).gauss(0.0, NOISE * (2.0 if fast else 1.0))
metric = true_metric(*knobs) + (0.02 if fast else 0.0) + noise
print("---")
print(f"val_bpb:          {{metric:.6f}}")
print(f"start_ts:         {{start:.6f}}")
print(f"end_ts:           {{time.time():.6f}}")
'''

SPACES = [
    "LR=log(0.001,0.1)",
    "WD=uniform(0,0.4)",
    "WARMUP=uniform(0,0.4)",
    "DEPTH=int(2,16)",
    "BETA2=uniform(0.8,0.999)",
    "MLP_RATIO=int(1,8)",
    "EMBED_LR=log(0.01,1)",
    "CLIP=uniform(0,2)",
]
START = {
    "LR": 0.002,
    "WD": 0.0,
    "WARMUP": 0.4,
    "DEPTH": 4,
    "BETA2": 0.8,
    "MLP_RATIO": 1,
    "EMBED_LR": 0.01,
    "CLIP": 0.0,
}

_truth: dict = {"math": math}
exec(TRUTH, _truth)  # the bench scores incumbents with the very function the target uses
true_metric = _truth["true_metric"]


def nightlab(*args: str, cwd: Path) -> str:
    proc = subprocess.run([sys.executable, "-m", "nightlab", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"nightlab {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def make_lab(root: Path, name: str, *, slots: int, seed: int, run: float, fast_slots: int = 0) -> Path:
    target = root / f"{name}-target"
    target.mkdir()
    train = TRAIN.replace("SIM_SEED = 0", f"SIM_SEED = {seed}").replace("RUN = 0.5", f"RUN = {run}")
    (target / "train.py").write_text(train)
    lab = root / name
    nightlab(
        "init", str(lab), "--target", str(target), "--cpu-slots", str(slots), "--timeout", "60", cwd=root
    )
    toml = lab / "nightlab.toml"
    text = toml.read_text().replace("idle_shutdown = 900", "idle_shutdown = 30")
    # The winner's own run is the new incumbent's figure; re-measuring it every few waves would
    # add a 17th run to a 16-slot wave and double its time.
    text = text.replace("incumbent_max_age_waves = 3", "incumbent_max_age_waves = 1000")
    if fast_slots:
        text = text.replace(
            "[search]", f'[[fleet.pool]]\nbackend = "local"\ntier = "fast"\nslots = {fast_slots}\n\n[search]'
        )
    toml.write_text(text)
    subprocess.run(["git", "commit", "-qam", "bench config"], cwd=lab, check=True)
    return lab


# --- one arm -----------------------------------------------------------------------------------


@dataclass
class Arm:
    strategy: str
    workers: int
    times: list[float]  # cumulative simulated seconds after each wave (noise floor first)
    truths: list[float]  # the incumbent's true metric after each wave
    wrong_keeps: int
    wall: float
    runs: int

    def time_to(self, target: float) -> float | None:
        for t, m in zip(self.times, self.truths, strict=True):
            if m <= target + 1e-12:
                return t
        return None


def _wave_span(exps) -> float:
    spans = [(e.metrics["start_ts"], e.metrics["end_ts"]) for e in exps if "start_ts" in e.metrics]
    if not spans:  # every run crashed before printing: count the ledger's run times
        spans = [(e.started_at, e.finished_at) for e in exps if e.started_at and e.finished_at]
    return max(b for _, b in spans) - min(a for a, _ in spans) if spans else 0.0


def run_arm(
    root: Path,
    *,
    strategy: str,
    workers: int,
    seed: int,
    run: float,
    waves: int,
    stop_at: float | None,
    screen: bool = False,
) -> Arm:
    from nightlab.lab import Lab
    from nightlab.research import run_search
    from nightlab.search.knobs import parse_value

    name = f"{strategy}{'-screen' if screen else ''}-{workers}-s{seed}"
    # screened: 12 fast workers screen, 4 validate (16 in all)
    lab_dir = make_lab(
        root,
        name,
        slots=4 if screen else workers,
        seed=seed,
        run=run,
        fast_slots=workers - 4 if screen else 0,
    )

    class Reached(Exception):
        pass

    def on_wave(summary) -> None:
        if stop_at is None or summary.adopted is None:
            return
        knobs = {**current, **{k: parse_value(v) for k, v in summary.adopted.knobs.items()}}
        current.update(knobs)
        if true_metric(**knobs) <= stop_at + 1e-12:
            raise Reached

    current = dict(START)
    started = time.time()
    with Lab(lab_dir) as lab:
        try:
            run_search(
                lab,
                strategy=strategy,
                spaces=SPACES,
                waves=waves,
                wave_size=1 if strategy == "greedy" else (workers - 4 if screen else workers),
                screen_tier="fast" if screen else None,
                top_k=3,
                repeats=1,
                seed=seed,
                poll=0.02,
            )
        except Reached:
            pass
        wall = time.time() - started
        # --- read the history back from the ledger
        truth = true_metric(**START)
        elapsed, times, truths, wrong, runs = 0.0, [], [], 0, 0
        for w in lab.ledger.waves():
            if w.design == "promote":
                continue  # timed with its screening wave, below
            exps = lab.ledger.experiments(wave=w.id)
            runs += len(exps)
            elapsed += _wave_span(exps)
            state = w.spec.get("search", {})
            adopted = state.get("adopted")
            if adopted:
                knobs = {k: parse_value(v) for k, v in {**_knobs_of(lab, adopted)}.items()}
                new = true_metric(**{**START, **knobs})
                wrong += new > truth
                truth = new
            if state.get("promotion"):
                elapsed += _wave_span(lab.ledger.experiments(wave=state["promotion"]))
            times.append(elapsed)
            truths.append(truth)
    nightlab("fleet", "stop", cwd=lab_dir)
    return Arm(strategy + ("+screen" if screen else ""), workers, times, truths, wrong, wall, runs)


def _knobs_of(lab, experiment_id: str) -> dict[str, str]:
    """The searched knobs of an experiment's snapshot (its own files, not its params)."""
    from nightlab.search.knobs import list_knobs

    files, _ = lab.files_of(experiment_id)
    knobs = {k.name: k.source for k in list_knobs(files["train.py"].decode())}
    return {k: knobs[k] for k in START}


# --- main --------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--run", type=float, default=0.3, help="seconds of a compressed '5-minute' run")
    parser.add_argument("--budget", type=int, default=60, help="waves (= runs) of the sequential greedy arm")
    parser.add_argument("--max-waves", type=int, default=10, help="waves a parallel arm may use")
    parser.add_argument(
        "--strategies", default="factorial,optuna", help="parallel strategies, comma-separated"
    )
    parser.add_argument("--screen", action="store_true", help="also run factorial screened on the fast tier")
    args = parser.parse_args()
    parallel = [s for s in args.strategies.split(",") if s]
    five_minutes = args.run  # the compressed length of a 5-minute run at the reference depth

    rows: dict[str, list[tuple[float | None, int, float]]] = {s: [] for s in parallel}
    if args.screen:
        rows["factorial+screen"] = []
    seq_rows = []
    with tempfile.TemporaryDirectory(prefix="nightlab-search-sim-") as tmp:
        root = Path(tmp)
        for seed in range(args.seeds):
            seq = run_arm(
                root, strategy="greedy", workers=1, seed=seed, run=args.run, waves=args.budget, stop_at=None
            )
            best = min(seq.truths)
            t_seq = seq.time_to(best)
            seq_rows.append((best, t_seq, seq.wrong_keeps, seq.wall))
            line = (
                f"seed {seed:2d}: greedy x1 best {best:.4f} at {t_seq:6.1f} s ({seq.wrong_keeps} wrong keeps)"
            )
            arms = [(s, False) for s in parallel] + ([("factorial", True)] if args.screen else [])
            for strategy, screen in arms:
                arm = run_arm(
                    root,
                    strategy=strategy,
                    workers=16,
                    seed=seed,
                    run=args.run,
                    waves=args.max_waves,
                    stop_at=best,
                    screen=screen,
                )
                t_par = arm.time_to(best)
                rows[arm.strategy].append((t_par, arm.wrong_keeps, arm.wall))
                shown = "not reached" if t_par is None else f"{t_seq / t_par:5.1f}x ({t_par:.1f} s)"
                line += f" | {arm.strategy} x16 {shown}, {arm.wrong_keeps} wrong"
            print(line, flush=True)

    hours = 5 / 60 / five_minutes  # simulated hours per second of compressed run time
    print()
    print(f"{args.seeds} seeds, a '5-minute' run = {args.run:g} s, greedy budget {args.budget} runs")
    seq_times = [t for _, t, _, _ in seq_rows]
    print(
        f"{'arm':<22}{'reached':>9}{'median T (sim h)':>18}{'median speed-up':>17}{'min':>7}{'wrong keeps':>13}"
    )
    print(
        f"{'greedy x1':<22}{len(seq_rows):>9}{statistics.median(seq_times) * hours:>18.2f}{'1.0x':>17}{'':>7}"
        f"{sum(w for *_, w, _ in seq_rows):>13}"
    )
    for name, results in rows.items():
        reached = [(t, ts) for (t, _, _), ts in zip(results, seq_times, strict=True) if t is not None]
        speedups = [ts / t for t, ts in reached]
        med_t = statistics.median(t for t, _ in reached) * hours if reached else float("nan")
        med_s = f"{statistics.median(speedups):.1f}x" if speedups else "-"
        low = f"{min(speedups):.1f}x" if speedups else "-"
        wrong = sum(w for _, w, _ in results)
        print(f"{name + ' x16':<22}{len(reached):>9}{med_t:>18.2f}{med_s:>17}{low:>7}{wrong:>13}")
    print("goal: >= 12x with 16 workers, 0 wrong keeps (public 16-GPU run: about 9x)")


if __name__ == "__main__":
    main()
