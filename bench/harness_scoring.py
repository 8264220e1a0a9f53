"""What the measurement protection costs per run on the cpu profile (issue 13).

Runs the template on the real `cpu` profile (30 s budget, demo data) both ways, alternating:

- in-process: today's evaluation path, the template with `hand_in` replaced by the harness's
  in-process `evaluate()` (what labs did before harness scoring), run directly;
- protected: the fleet's path, `python -P -m nightlab.harness.attempt ... -- python train.py`
  (bubblewrap sandbox when available, export + save, a second process scoring the program with
  the hidden probe).

Prints wall time per run and the protected run's parts (export, sandbox start, scoring), and the
goal: at most 10 % more wall time per run. Figures go to bench/RESULTS.md by hand.

`--baseline-src DIR` compares two trees instead (issue 30): both ways run protected, the first with
`PYTHONPATH=DIR` (e.g. the main checkout's `src`, clock in train.py), the second with this tree
(batches served by the supervisor); it prints wall time, optimizer steps in the budget and the
hand-in delay of each, and the goal: at most 5 % more wall time per run.

Usage: .venv/bin/python bench/harness_scoring.py [--pairs 2] [--budget 30] [--threads 1] [--baseline-src DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from importlib import resources
from pathlib import Path

from nightlab.harness.data import prepare
from nightlab.harness.names import ISOLATED
from nightlab.harness.profiles import get_profile
from nightlab.harness.sandbox import available
from nightlab.search.knobs import set_knobs

IN_PROCESS = (
    "from nightlab.harness.evaluate import evaluate\n"
    "    r = evaluate(model, profile, batch_size=DEVICE_BATCH_SIZE, device=accel.device, autocast=accel.autocast)\n"
    "    score = {'val_bpb': r.val_bpb, 'eval_seconds': r.seconds, 'invalid_reason': r.invalid_reason}"
)


def lab_with(folder: Path, profile, source: str) -> Path:
    folder.mkdir(parents=True)
    rows = [
        f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {v!r}"
        for k, v in profile.to_dict().items()
        if k != "train_defaults"
    ]
    (folder / "nightlab.toml").write_text("[profile]\n" + "\n".join(rows) + "\n")
    (folder / "train.py").write_text(source)
    return folder


def timed(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> float:
    start = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=900)
        finally:
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
    if code != 0:
        raise SystemExit(f"run failed (exit {code}); see {log}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=2, help="in-process / protected pairs to run")
    parser.add_argument("--budget", type=float, default=30.0, help="training budget (the cpu profile's: 30)")
    parser.add_argument(
        "--threads", type=int, default=1, help="OMP_NUM_THREADS for both ways (a fleet slot sets it too)"
    )
    parser.add_argument(
        "--baseline-src", type=Path, help="compare protected runs of this src tree (first) and ours"
    )
    args = parser.parse_args()
    if args.baseline_src:
        return compare_trees(args)

    profile = replace(get_profile("cpu"), budget_seconds=args.budget)
    root = Path(tempfile.mkdtemp(prefix="harness-bench-"))
    try:
        env, template = _prepared(profile, root, args.threads)
        old = template.replace("score = hand_in(model, batches).score", IN_PROCESS)
        assert old != template

        t = time.perf_counter()
        subprocess.run(["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid", "true"],
                       check=False, capture_output=True)  # fmt: skip
        sandbox_start = time.perf_counter() - t
        print(f"sandbox: {available() or 'bwrap'} | bwrap start + exit: {sandbox_start * 1000:.0f} ms | "
              f"load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
        rows = []
        for i in range(args.pairs):
            a = lab_with(root / f"old{i}", profile, old)
            wall_old = timed([sys.executable, "train.py"], a, env, a / "log.txt")
            b = lab_with(root / f"new{i}", profile, template)
            run_dir = b / ".nightlab" / "runs" / "e0001" / "attempt-1"
            work = run_dir / "work"
            work.mkdir(parents=True)
            for name in ("train.py", "nightlab.toml"):
                (work / name).write_text((b / name).read_text())
            cmd = [sys.executable, *ISOLATED, "-m", "nightlab.harness.attempt", "--run-dir", str(run_dir), "--lab", str(b),
                   "--", f"{sys.executable} train.py"]  # fmt: skip
            wall_new = timed(cmd, work, env, run_dir / "log.txt")
            score = json.loads((run_dir / "score.json").read_text())
            score_part = wall_new - score["train_wall_seconds"]
            rows.append((wall_old, wall_new))
            print(
                f"pair {i}: in-process {wall_old:.1f} s | protected {wall_new:.1f} s ({100 * (wall_new / wall_old - 1):+.1f} %) "
                f"= train process {score['train_wall_seconds']:.1f} s (export {score['export_seconds']:.1f} s) "
                f"+ scoring {score_part:.1f} s (eval {score['eval_seconds']:.1f} s, {score['probe_rows']} probe rows) | "
                f"val_bpb {score.get('val_bpb')} | load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
        old_mean = sum(r[0] for r in rows) / len(rows)
        new_mean = sum(r[1] for r in rows) / len(rows)
        extra = 100 * (new_mean / old_mean - 1)
        print(f"mean: in-process {old_mean:.1f} s, protected {new_mean:.1f} s: {extra:+.1f} % "
              f"(goal <= +10 %: {'PASS' if extra <= 10 else 'MISS'})")  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)  # two labs and their data per pair: ~10 MB


def protected_run(folder: Path, profile, source: str, env: dict[str, str]) -> tuple[float, dict]:
    """One supervised run of `source` in a fresh lab under `folder`: (wall seconds, score.json)."""
    b = lab_with(folder, profile, source)
    run_dir = b / ".nightlab" / "runs" / "e0001" / "attempt-1"
    work = run_dir / "work"
    work.mkdir(parents=True)
    for name in ("train.py", "nightlab.toml"):
        (work / name).write_text((b / name).read_text())
    cmd = [sys.executable, *ISOLATED, "-m", "nightlab.harness.attempt", "--run-dir", str(run_dir), "--lab", str(b),
           "--", f"{sys.executable} train.py"]  # fmt: skip
    wall = timed(cmd, work, env, run_dir / "log.txt")
    return wall, json.loads((run_dir / "score.json").read_text())


def _prepared(profile, root: Path, threads: int) -> tuple[dict[str, str], str]:
    """The runs' environment (no NIGHTLAB_ overrides, data under `root`) and the template, data prepared."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTLAB_")}
    env.update(NIGHTLAB_DATA_DIR=str(root / "data"), NIGHTLAB_SEED="0", PYTHONUNBUFFERED="1")
    # on a loaded 2-core box two OpenMP threads per process thrash (a scoring forward pass took 4.7 s
    # with 2 threads, 0.63 s with 1): pin both ways to the same count, as a fleet slot does
    env["OMP_NUM_THREADS"] = str(threads)
    os.environ["NIGHTLAB_DATA_DIR"] = env["NIGHTLAB_DATA_DIR"]
    prepare(profile, progress=False)
    template = set_knobs(
        resources.files("nightlab.targets.gpt").joinpath("train.py").read_text(), profile.train_defaults
    )
    return env, template


def compare_trees(args: argparse.Namespace) -> None:
    """Protected runs of the baseline tree and of this one, alternating (see the module docstring)."""
    import nightlab

    ours = Path(nightlab.__file__).resolve().parents[1]
    profile = replace(get_profile("cpu"), budget_seconds=args.budget)
    root = Path(tempfile.mkdtemp(prefix="harness-bench-"))
    try:
        env, template = _prepared(profile, root, args.threads)
        sides = {"baseline": str(args.baseline_src.resolve()), "served": str(ours)}
        print(f"baseline {sides['baseline']} | served {sides['served']} | sandbox {available() or 'bwrap'}")
        walls: dict[str, list[float]] = {k: [] for k in sides}
        for i in range(args.pairs):
            for side, src in sides.items():
                wall, score = protected_run(
                    root / f"{side}{i}", profile, template, {**env, "PYTHONPATH": src}
                )
                walls[side].append(wall)
                print(
                    f"pair {i} {side:8}: wall {wall:.1f} s | train process {score['train_wall_seconds']:.1f} s | "
                    f"steps {score.get('steps')} (warm-up {score.get('warmup_steps')}) | training "
                    f"{score.get('training_seconds')} s | hand-in delay {score.get('handin_delay_seconds', 'n/a')} s | "
                    f"val_bpb {score.get('val_bpb')} | load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
        base = sum(walls["baseline"]) / len(walls["baseline"])
        served = sum(walls["served"]) / len(walls["served"])
        extra = 100 * (served / base - 1)
        print(f"mean wall: baseline {base:.1f} s, served {served:.1f} s: {extra:+.1f} % "
              f"(goal <= +5 %: {'PASS' if extra <= 5 else 'MISS'})")  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
