"""Benchmark: the GPT template on the `cpu` profile, against this machine's fp32 matmul rate.

Prepares the cpu profile's data (offline `demo` dataset) if needed, builds a throwaway lab from
the template (the profile's train_defaults applied), and runs `train.py` once per variant with
`OMP_NUM_THREADS` threads. Each variant is a set of knob overrides; the default pair compares the
template's MATRIX_LR with a far too small one, which the 30 s budget must clearly separate.

Achieved GFLOP/s = the model's training FLOPs per token x steady-state tokens/s. The reference is
the best fp32 square-matmul rate measured here just before (sizes 256..1024), passed to train.py
as `NIGHTLAB_PEAK_FLOPS`, so its `mfu_percent` is "percent of this machine's matmul rate".

Usage:
    .venv/bin/python bench/cpu_train.py                       # template vs MATRIX_LR=0.0005
    .venv/bin/python bench/cpu_train.py --threads 2 --variant "" --variant "DEPTH=3 HEAD_DIM=64"
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path


def matmul_gflops(threads: int) -> float:
    """Best fp32 matmul rate over a few square sizes, GFLOP/s."""
    import torch

    torch.set_num_threads(threads)
    best = 0.0
    for n in (256, 512, 1024):
        a, b = torch.randn(n, n), torch.randn(n, n)
        for _ in range(3):
            a @ b
        reps, start = 0, time.perf_counter()
        while time.perf_counter() - start < 1.0:
            a @ b
            reps += 1
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - start) / 1e9)
    return best


def parse_summary(output: str) -> dict[str, str]:
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == "---"]
    pairs = (line.split(":", 1) for line in lines[starts[-1] + 1 :] if ":" in line) if starts else ()
    return {k.strip(): v.strip() for k, v in pairs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS for train.py (default 2)")
    parser.add_argument(
        "--budget", type=float, default=None, help="training seconds (default: the profile's)"
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=None,
        help='knob overrides "NAME=VALUE NAME=VALUE"; "" = the template as is (repeatable; '
        'default: "" and "MATRIX_LR=0.0005")',
    )
    args = parser.parse_args()
    variants = args.variant if args.variant is not None else ["", "MATRIX_LR=0.0005"]

    from nightlab.harness.data import prepare
    from nightlab.harness.profiles import get_profile
    from nightlab.search.knobs import set_knobs

    profile = get_profile("cpu", budget=args.budget)
    prepare(profile, progress=False)
    rate = matmul_gflops(args.threads)
    print(f"fp32 matmul, {args.threads} threads: {rate:.1f} GFLOP/s", flush=True)
    template = resources.files("nightlab.targets.gpt").joinpath("train.py").read_text()
    rows = []
    with tempfile.TemporaryDirectory(prefix="nightlab-bench-") as tmp:
        lab = Path(tmp)
        table = profile.to_dict()
        table_lines = [
            f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"'
            for k, v in table.items()
            if k != "train_defaults"
        ]
        (lab / "nightlab.toml").write_text("[profile]\n" + "\n".join(table_lines) + "\n")
        for variant in variants:
            overrides = dict(profile.train_defaults)
            overrides.update(item.split("=", 1) for item in variant.split())
            (lab / "train.py").write_text(set_knobs(template, overrides))
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "NIGHTLAB_PEAK_FLOPS": str(rate * 1e9)}
            start = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "train.py"], cwd=lab, env=env, capture_output=True, text=True
            )
            wall = time.perf_counter() - start
            summary = parse_summary(proc.stdout)
            if proc.returncode != 0 or "val_bpb" not in summary:
                print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
                rows.append((variant or "template", "FAILED", "", "", "", "", "", f"{wall:.1f}"))
                continue
            mfu = float(summary["mfu_percent"])
            rows.append(
                (
                    variant or "template",
                    summary["val_bpb"],
                    summary["tok_per_sec"],
                    f"{mfu * rate / 100:.1f}",
                    f"{mfu:.1f}",
                    summary["startup_seconds"],
                    summary["eval_seconds"],
                    f"{wall:.1f}",
                )
            )
            print(f"done: {variant or 'template'}", flush=True)
    header = ("variant", "val_bpb", "tok/s", "GFLOP/s", "% matmul", "startup s", "eval s", "wall s")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))


if __name__ == "__main__":
    main()
