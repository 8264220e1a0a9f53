"""Search simulation: 1 worker running the greedy hill climb against 16 workers running each parallel strategy.

The target's metric is a known function of eight knobs (`TRUTH` below; the run is a shell script
that evaluates the same function in awk, so a run costs milliseconds of CPU):

    lr_opt = 0.02 * 10 ** (1.5 (WD - 0.2)) * (10 / DEPTH) ** 0.5    (LR x WD and LR x DEPTH)
    metric = 0.9 + 1.5 (log10 LR - log10 lr_opt)^2 + 3 (WD - 0.2)^2 + (WARMUP - 0.1)^2
                 + 0.003 (DEPTH - 10)^2 + 4 (BETA2 - 0.95)^2 + 0.01 (MLP_RATIO - 4)^2
                 + 0.3 (log10 EMBED_LR - log10 0.2)^2 + 0.05 (CLIP - 1)^2 + noise (sd 0.003)

a narrow optimum in LR, a crash region (LR x DEPTH > 0.8 prints a NaN failure), a run time that
grows with DEPTH (0.5 + 0.05 DEPTH times the base), and a second tier `fast` that runs 4x faster
and scores 0.02 worse with twice the noise (`--screen`). The start is far off (metric 3.17; the
optimum is 0.9). Time is compressed: a "5-minute" run sleeps `--run` seconds (0.3 by default).

The real lab runs it: `nightlab init`, the local fleet (the controller, 1 or 16 CPU slots), and
`research.run_search` (the code behind `nightlab search`: the noise floor's repeats alongside
the first wave, best of each wave judged with the Sidak-corrected z, within-noise bests settled
by repeats, adoption). Time is the runs' own time on the critical path: runs submitted together
form a round, which counts its longest run (the target prints its start and end) times the
rounds of slots it needs. Left out: the controller's launch stagger (about 70 ms per run
on this box, which would dominate a 16-wide wave of 0.3 s runs and is nothing next to 5 minutes)
and the loop's bookkeeping between waves.

Per seed, greedy x1 runs `--budget` waves (about one run each). Its best true metric after a
quarter, half and all of the budget are the targets; each parallel arm (16 workers, waves of 16)
runs until it reaches the last target or `--max-waves`. Speed-up = greedy's time to a target / the
arm's. A wrong keep is an adoption whose true metric is worse than the incumbent it replaced.

Goal (issue 4): with 16 workers, >= 12x at greedy's full budget (the public 16-GPU run: about 9x)
and no wrong keep in 20 seeded runs.

Usage: .venv/bin/python bench/search_sim.py [--seeds 20] [--first-seed 0] [--run 0.3] [--budget 60] [--max-waves 12]
           [--strategies factorial,optuna,pattern,surface] [--screen] [--step]
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

from _cli import nightlab  # bench/_cli.py (the script's folder is on sys.path)

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

# The editable file: knobs only. The run itself is a shell script plus awk (fixed files), so a run
# costs a few milliseconds of CPU: 16 concurrent Python start-ups would saturate a 2-core machine
# and time the CPU, not the search.
KNOBS = """\
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
"""

SIM_AWK = r"""
# knobs.py -> "sleep_seconds metric crashed"; the same function as TRUTH in search_sim.py
/^[A-Z][A-Z0-9_]* *=/ { line = $0; sub(/#.*/, "", line); split(line, kv, "="); name = kv[1]
    gsub(/ /, "", name); k[name] = kv[2] + 0 }
function lg(x) { return log(x) / log(10) }
END {
    fast = (tier == "fast")
    lr = k["LR"]; wd = k["WD"]; depth = k["DEPTH"]
    lr_opt = 0.02 * 10 ^ (1.5 * (wd - 0.2)) * (10 / depth) ^ 0.5
    m = 0.9 + 1.5 * (lg(lr) - lg(lr_opt)) ^ 2 + 3.0 * (wd - 0.2) ^ 2 + 1.0 * (k["WARMUP"] - 0.1) ^ 2
    m += 0.003 * (depth - 10) ^ 2 + 4.0 * (k["BETA2"] - 0.95) ^ 2 + 0.01 * (k["MLP_RATIO"] - 4) ^ 2
    m += 0.3 * (lg(k["EMBED_LR"]) - lg(0.2)) ^ 2 + 0.05 * (k["CLIP"] - 1.0) ^ 2
    # seeded noise: one stream per (simulation, run seed, knob values, tier)
    s = k["SIM_SEED"] * 7919 + seed * 104729 + int(lr * 1e7) + int(wd * 1e5) * 3 + int(k["WARMUP"] * 1e5) * 5
    s += depth * 11 + int(k["BETA2"] * 1e5) * 13 + k["MLP_RATIO"] * 17 + int(k["EMBED_LR"] * 1e6) * 19
    s += int(k["CLIP"] * 1e5) * 23 + fast * 29
    srand(s % 2147483647); u1 = rand(); u2 = rand(); if (u1 < 1e-12) u1 = 1e-12
    noise = k["NOISE"] * (fast ? 2 : 1) * sqrt(-2 * log(u1)) * cos(6.283185307 * u2)
    printf "%.4f %.6f %d\n", k["RUN"] * (0.5 + 0.05 * depth) * (fast ? 0.25 : 1), m + (fast ? 0.02 : 0) + noise, (lr * depth > 0.8)
}
"""

TRAIN_SH = """\
START=$(date +%s.%N)
set -- $(awk -v tier="$NIGHTLAB_TIER" -v seed="${NIGHTLAB_SEED:-0}" -f sim.awk knobs.py)
sleep "$1"
if [ "$3" = 1 ]; then echo "FAIL: loss is nan at step 40"; exit 1; fi
echo ---
echo "val_bpb: $2"
echo "start_ts: $START"
echo "end_ts: $(date +%s.%N)"
"""

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


def make_lab(root: Path, name: str, *, slots: int, seed: int, run: float, fast_slots: int = 0) -> Path:
    target = root / f"{name}-target"
    target.mkdir()
    knobs = KNOBS.replace("SIM_SEED = 0", f"SIM_SEED = {seed}").replace("RUN = 0.5", f"RUN = {run}")
    (target / "knobs.py").write_text(knobs)
    (target / "sim.awk").write_text(SIM_AWK)
    (target / "train.sh").write_text(TRAIN_SH)
    lab = root / name
    nightlab(
        "init",
        str(lab),
        "--target",
        str(target),
        "--editable",
        "knobs.py",
        "--command",
        "sh train.sh",
        "--cpu-slots",
        str(slots),
        "--oversubscribe",  # the slots stand in for GPUs and sleep: more of them than cores is the point
        "--timeout",
        "60",
        cwd=root,
    )
    toml = lab / "nightlab.toml"
    text = toml.read_text().replace("idle_shutdown = 900", "idle_shutdown = 30")
    # The winner's own run is the new incumbent's figure; re-measuring it every few waves would
    # add a 17th run to a 16-slot wave and double its time.
    text = text.replace("incumbent_max_age_waves = 3", "incumbent_max_age_waves = 1000")
    if fast_slots:
        pool = f'[[fleet.pool]]\nbackend = "local"\ntier = "fast"\nslots = {fast_slots}\n\n'
        text = text.replace("[search]", pool + "[search]")
    toml.write_text(text)
    subprocess.run(["git", "commit", "-qam", "bench config"], cwd=lab, check=True)
    return lab


def check_target(root: Path) -> None:
    """The awk metric equals `true_metric` (noise off): the bench scores what the runs measure."""
    probe = root / "probe"
    probe.mkdir()
    (probe / "sim.awk").write_text(SIM_AWK)
    for point in (START, {**START, "LR": 0.02, "WD": 0.2, "DEPTH": 10, "EMBED_LR": 0.2}):
        text = KNOBS.replace("NOISE = 0.003", "NOISE = 0.0")
        for name, value in point.items():
            text = "\n".join(
                f"{name} = {value!r}" if line.startswith(f"{name} =") else line for line in text.splitlines()
            )
        (probe / "knobs.py").write_text(text + "\n")
        out = subprocess.run(
            ["awk", "-v", "tier=cpu", "-v", "seed=0", "-f", "sim.awk", "knobs.py"],
            cwd=probe,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        if abs(float(out[1]) - true_metric(**point)) > 1e-5:
            sys.exit(f"the awk target disagrees with true_metric at {point}: {out[1]}")


# --- one arm -----------------------------------------------------------------------------------


@dataclass
class Arm:
    strategy: str
    workers: int
    times: list[float]  # cumulative simulated seconds after each wave (the noise floor's wave first)
    truths: list[float]  # the incumbent's true metric after each wave
    wrong_keeps: int
    wall: float
    runs: int

    def time_to(self, target: float) -> float | None:
        for t, m in zip(self.times, self.truths, strict=True):
            if m <= target + 1e-12:
                return t
        return None


def _duration(e) -> float:
    if "start_ts" in e.metrics:  # the target's own run time
        return e.metrics["end_ts"] - e.metrics["start_ts"]
    return (e.finished_at or e.started_at) - e.started_at  # a crash: the ledger's run time


def _timeline(exps, slots: dict[str, int]) -> dict[str, float]:
    """When each run's round ended, in run time with instant dispatch: experiment id -> seconds.

    Runs submitted while the previous round was still running join it (the noise floor's repeats
    run alongside the first wave; a promotion or settle round starts after its wave ended). A
    round lasts, per tier, its longest run times ceil(runs / the tier's slots); tiers run side by side.

    The controller starts runs one after another (about 70 ms apart on this box), which at 0.3 s
    per run would dominate a 16-wide wave; at 5 minutes per run it is noise.
    """
    done = sorted((e for e in exps if e.started_at is not None), key=lambda e: e.submitted_at)
    rounds: list[list] = []
    for e in done:
        if rounds and e.submitted_at < max(x.finished_at or x.started_at for x in rounds[-1]):
            rounds[-1].append(e)
        else:
            rounds.append([e])
    ended, elapsed = {}, 0.0
    for r in rounds:
        per_tier: dict[str, list] = {}
        for e in r:
            per_tier.setdefault(e.tier, []).append(e)
        elapsed += max(
            max(_duration(e) for e in es) * math.ceil(len(es) / slots[t]) for t, es in per_tier.items()
        )
        ended.update({e.id: elapsed for e in r})
    return ended


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
    step: bool = False,
) -> Arm:
    from nightlab.lab import Lab
    from nightlab.search.knobs import parse_value
    from nightlab.search_loop import run_search, tier_slots

    variant = ("+screen" if screen else "") + ("+step" if step else "")
    name = f"{strategy}{variant.replace('+', '-')}-{workers}-s{seed}"
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
                wave_size=workers - 4 if screen else workers,
                screen_tier="fast" if screen else None,
                top_k=3,
                repeats=1,
                seed=seed,
                effects_step=step,
                poll=0.02,
            )
        except Reached:
            pass
        wall = time.time() - started
        # --- read the history back from the ledger
        slots = {t: tier_slots(lab, t) for t in lab.config.fleet.tiers}
        ended = _timeline(lab.ledger.experiments(), slots)
        truth = true_metric(**START)
        elapsed, times, truths, wrong, runs = 0.0, [], [], 0, 0
        for w in lab.ledger.waves():
            if w.design == "promote":
                continue  # timed with its screening wave, below
            exps = lab.ledger.experiments(wave=w.id)
            state = lab.ledger.search_progress(w.id)  # None for the noise floor's wave
            if state is not None and state.promotion:
                exps += lab.ledger.experiments(wave=state.promotion)
            runs += len(exps)
            elapsed = max([elapsed] + [ended[e.id] for e in exps if e.id in ended])
            adopted = state.adopted if state is not None else None
            if adopted:
                knobs = {k: parse_value(v) for k, v in {**_knobs_of(lab, adopted)}.items()}
                new = true_metric(**{**START, **knobs})
                wrong += new > truth
                truth = new
            times.append(elapsed)
            truths.append(truth)
    nightlab("fleet", "stop", cwd=lab_dir)
    return Arm(strategy + variant, workers, times, truths, wrong, wall, runs)


def _knobs_of(lab, experiment_id: str) -> dict[str, str]:
    """The searched knobs of an experiment's snapshot (its own files, not its params)."""
    from nightlab.search.knobs import list_knobs

    files, _ = lab.files_of(experiment_id)
    knobs = {k.name: k.source for k in list_knobs(files["knobs.py"].decode())}
    return {k: knobs[k] for k in START}


# --- main --------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument(
        "--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1"
    )
    parser.add_argument("--run", type=float, default=0.3, help="seconds of a compressed '5-minute' run")
    parser.add_argument("--budget", type=int, default=60, help="waves (~ runs) of the sequential greedy arm")
    parser.add_argument("--max-waves", type=int, default=12, help="waves a parallel arm may use")
    parser.add_argument(
        "--strategies",
        default="factorial,optuna,pattern,surface",
        help="parallel strategies, comma-separated",
    )
    parser.add_argument("--screen", action="store_true", help="also run factorial screened on the fast tier")
    parser.add_argument("--step", action="store_true", help="also run factorial with the main-effects step")
    args = parser.parse_args()
    # Targets: what greedy reached after a quarter, half and all of its budget.
    checkpoints = sorted({max(1, args.budget // 4), max(1, args.budget // 2), args.budget})
    arms = [(s, False, False) for s in args.strategies.split(",") if s]
    arms += [("factorial", True, False)] if args.screen else []
    arms += [("factorial", False, True)] if args.step else []
    names = [s + ("+screen" if screen else "") + ("+step" if step else "") for s, screen, step in arms]

    # per checkpoint: greedy's time per seed, and each arm's time per seed (None: not reached)
    seq_times: dict[int, list[float]] = {c: [] for c in checkpoints}
    par_times: dict[str, dict[int, list[float | None]]] = {n: {c: [] for c in checkpoints} for n in names}
    wrong: dict[str, int] = {"greedy": 0, **{n: 0 for n in names}}
    with tempfile.TemporaryDirectory(prefix="nightlab-search-sim-") as tmp:
        root = Path(tmp)
        check_target(root)
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            seq = run_arm(
                root, strategy="greedy", workers=1, seed=seed, run=args.run, waves=args.budget, stop_at=None
            )
            wrong["greedy"] += seq.wrong_keeps
            targets = {c: min(seq.truths[: c + 1]) for c in checkpoints}  # truths[0]: after the noise floor
            for c, target in targets.items():
                seq_times[c].append(seq.time_to(target))
            line = f"seed {seed:2d}: greedy x1 best {targets[args.budget]:.4f} at {seq_times[args.budget][-1]:5.1f} s"
            for (strategy, screen, step), name in zip(arms, names, strict=True):
                arm = run_arm(
                    root,
                    strategy=strategy,
                    workers=16,
                    seed=seed,
                    run=args.run,
                    waves=args.max_waves,
                    stop_at=targets[args.budget],
                    screen=screen,
                    step=step,
                )
                wrong[name] += arm.wrong_keeps
                for c, target in targets.items():
                    par_times[name][c].append(arm.time_to(target))
                t = par_times[name][args.budget][-1]
                shown = "not reached" if t is None else f"{seq_times[args.budget][-1] / t:4.1f}x"
                line += f" | {name} x16 {shown}, best {min(arm.truths):.4f}"
            print(line, flush=True)

    hours = 5 / 60 / args.run  # simulated hours per second of compressed run time
    print()
    print(
        f"{args.seeds} seeds; a '5-minute' run = {args.run:g} s; time = target run time on the critical path, "
        "in simulated hours; speed-up = greedy's time / the arm's, per seed, median (min-max) over seeds that reached"
    )
    header = f"{'arm':<20}{'wrong keeps':>12}"
    for c in checkpoints:
        header += f"{'greedy best after ' + str(c) + ' runs':>36}"
    print(header)
    row = f"{'greedy x1':<20}{wrong['greedy']:>12}"
    for c in checkpoints:
        row += f"{statistics.median(seq_times[c]) * hours:>30.2f} h 1.0x"
    print(row)
    for name in names:
        row = f"{name + ' x16':<20}{wrong[name]:>12}"
        for c in checkpoints:
            pairs = [(ts, t) for ts, t in zip(seq_times[c], par_times[name][c], strict=True) if t]
            if not pairs:
                row += f"{'not reached':>36}"
                continue
            speedups = sorted(ts / t for ts, t in pairs)
            cell = (
                f"{len(pairs)}/{args.seeds} {statistics.median(t for _, t in pairs) * hours:.2f} h "
                f"{statistics.median(speedups):.1f}x ({speedups[0]:.1f}-{speedups[-1]:.1f})"
            )
            row += f"{cell:>36}"
        print(row)
    print("goal: >= 12x with 16 workers at greedy's full budget, 0 wrong keeps (public 16-GPU run: about 9x)")


if __name__ == "__main__":
    main()
