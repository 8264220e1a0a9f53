"""A fast stand-in of bench/search_sim.py for tuning a strategy: the same objective, spaces, knob
rounding, noise level, time model and verdict rule, without the lab.

No controller, git or processes: the real `run_loop` (the loop of `nightlab search`) drives the
strategy over an in-memory lab (`Standin`) that draws the metric from
`search_sim.true_metric` plus Gaussian noise (sd 0.003; the real target's noise is a hash of the
knobs, so per-seed results differ), times the wave by its longest run, and adopts the wave's best
with `decide.best_of_wave` against the incumbent's runs. The noise floor's 3 repeats share the
first wave's round, as in `nightlab search`; settle rounds are left out. Greedy's targets (its
best true metric after 60 runs, and when it got there) come from the real bench:
bench/greedy_targets.json holds seeds 0-39 as measured on 2026-11-30 (bench/RESULTS.md).

40 seeds take seconds instead of 40 minutes, and on 2026-11-30 the stand-in's median speed-up was
within about 1x of the real bench's (surface: 12.4x vs 12.3x on seeds 0-19, 11.4-11.9x vs 10.9x
on 20-39). Real figures still come only from search_sim.py.

Usage: .venv/bin/python bench/search_standin.py [--strategy surface] [--seeds 0-39] [--noise-seed 0]
           [--option NAME=VALUE ...] [--verbose]
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
from pathlib import Path

import numpy as np
from search_sim import SPACES, START, true_metric  # bench/ is on sys.path when run as a script

from nightlab.search.decide import best_of_wave, pooled_sd
from nightlab.search.knobs import parse_value
from nightlab.search.spaces import parse_space
from nightlab.search.strategies import Observation, WaveSummary, make_strategy, run_loop

DIMS = [parse_space(s) for s in SPACES]
NOISE, RUN, WORKERS, FLOOR = 0.003, 0.3, 16, 3


def _value(knobs: dict[str, str]) -> dict[str, object]:
    return {name: parse_value(text) for name, text in knobs.items()}


class Standin:
    """An in-memory lab for `run_loop`: the objective plus noise, waves timed by their longest run."""

    def __init__(self, seed: int, noise_seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed + 1000 * noise_seed)
        self.incumbent = {d.name: d.to_source(START[d.name]) for d in DIMS}
        self.figure = [self.measure(self.incumbent) for _ in range(FLOOR)]
        # the tier's repeated runs: its noise floor
        self.repeats = {tuple(sorted(self.incumbent.items())): list(self.figure)}
        self.runs: dict[str, list[Observation]] = {}
        self.elapsed, self.times, self.truths = 0.0, [], []

    def measure(self, knobs: dict[str, str]) -> float | None:
        v = _value(knobs)
        if v["LR"] * v["DEPTH"] > 0.8:  # the target's crash region
            return None
        return true_metric(**v) + NOISE * self.rng.standard_normal()

    def seconds(self, knobs: dict[str, str]) -> float:
        return RUN * (0.5 + 0.05 * _value(knobs)["DEPTH"])

    def submit(self, proposals: list[dict[str, str]], index: int) -> str:
        wave_id = f"w{index}"
        self.runs[wave_id] = [
            Observation(f"{wave_id}-{i}", p, self.measure({**self.incumbent, **p}), index)
            for i, p in enumerate(proposals)
        ]
        self.elapsed += max(self.seconds({**self.incumbent, **p}) for p in proposals + [self.incumbent])
        return wave_id

    def wait(self, wave_id: str) -> list[Observation]:
        return self.runs[wave_id]

    def decide(self, wave_id: str, runs: list[Observation]) -> tuple[Observation | None, str | None]:
        """`best_of_wave` over the wave's configurations other than the incumbent, pooled noise floor."""
        by_config: dict[tuple, list[Observation]] = {}
        for o in runs:
            by_config.setdefault(tuple(sorted(o.knobs.items())), []).append(o)
        here = tuple(sorted(self.incumbent.items()))
        candidates = {
            group[0].id: [o.value for o in group if o.value is not None]
            for key, group in by_config.items()
            if key != here
        }
        for key, group in by_config.items():
            self.repeats.setdefault(key, []).extend(o.value for o in group if o.value is not None)
        sigma, dof = pooled_sd(self.repeats.values())
        picked = best_of_wave(candidates, self.figure, noise_sigma=sigma, noise_dof=dof)
        if picked is None:
            return None, None
        winner = next(o for o in runs if o.id == picked[0])
        return (winner if picked[1].verdict == "keep" else None), picked[1].verdict

    def adopt(self, winner: Observation) -> None:
        self.incumbent = {**self.incumbent, **winner.knobs}
        runs = self.runs[f"w{winner.wave}"]
        self.figure = [o.value for o in runs if o.knobs == winner.knobs and o.value is not None]

    def on_wave(self, summary: WaveSummary) -> None:
        self.times.append(self.elapsed)
        self.truths.append(true_metric(**_value(self.incumbent)))


def run(seed: int, strategy: str, options: dict, *, waves: int, noise_seed: int = 0) -> tuple[list, list]:
    """(cumulative seconds, the incumbent's true metric) after each wave of one search, by `run_loop`:
    the noise floor's repeats share the first wave's round, as in `nightlab search`."""
    lab = Standin(seed, noise_seed)
    run_loop(
        make_strategy(strategy, DIMS, **options),
        incumbent=lab.incumbent,
        wave_size=WORKERS,
        first_wave_size=WORKERS - FLOOR,
        submit_wave=lab.submit,
        wait_wave=lab.wait,
        decide=lab.decide,
        adopt=lab.adopt,
        waves=waves,
        on_wave=lab.on_wave,
        incumbent_values=lambda: lab.figure,
    )
    return lab.times, lab.truths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="surface")
    parser.add_argument("--seeds", default="0-39", help="a range FIRST-LAST of seeds in greedy_targets.json")
    parser.add_argument("--noise-seed", type=int, default=0, help="another draw of the noise")
    parser.add_argument("--waves", type=int, default=12)
    parser.add_argument(
        "--option", action="append", default=[], metavar="NAME=VALUE", help="a strategy option"
    )
    parser.add_argument("--verbose", action="store_true", help="print each seed's path")
    args = parser.parse_args()
    first, last = (int(x) for x in args.seeds.split("-"))
    options = {k: ast.literal_eval(v) for k, v in (o.split("=", 1) for o in args.option)}
    targets = json.loads((Path(__file__).parent / "greedy_targets.json").read_text())
    speedups = []
    for seed in range(first, last + 1):
        greedy = targets[str(seed)]
        times, truths = run(seed, args.strategy, options, waves=args.waves, noise_seed=args.noise_seed)
        reached = next((t for t, m in zip(times, truths, strict=True) if m <= greedy["target"] + 1e-12), None)
        speedups.append(0.0 if reached is None else greedy["time"] / reached)
        if args.verbose:
            path = " ".join(f"{m:.4f}@{t:.2f}" for t, m in zip(times, truths, strict=True))
            print(f"seed {seed:2d} target {greedy['target']:.4f}: {path}")
    reached = sum(s > 0 for s in speedups)
    print(
        f"{args.strategy} {options or ''}: {reached}/{len(speedups)} reached greedy's 60-run level, "
        f"median {statistics.median(speedups):.1f}x counting misses as 0 (stand-in, not a measurement)"
    )


if __name__ == "__main__":
    main()
