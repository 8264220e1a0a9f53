"""Benchmark: building the journal of a night-sized ledger, and the restart prompt that embeds it.

Builds a throwaway lab over a synthetic train.py, records N finished experiments directly in
the ledger (distinct knob values, a few crashes, repeats; no fleet involved), then measures:

- `build_journal` as shipped: every snapshot's files read through one `git cat-file --batch`;
- the same diff summaries with the files read by two `git show` calls per idea (the obvious way);
- `to_text()` and `to_text(max_chars=40_000)` sizes, and `build_prompt` end to end, with its
  size in tokens (characters / 4) against `PROMPT_TOKEN_BUDGET`.

Usage:
    .venv/bin/python bench/journal.py            # 900 experiments (the 16-GPU overnight run's size)
    .venv/bin/python bench/journal.py --n 200
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = """\
import time
LR = 0.01
WD = 0.1
DEPTH = 8
WARMUP = 0.05
SEED = 0


def model(x):
    return x * DEPTH


time.sleep(0.01)
print("---")
print("val_bpb: 1.0")
"""
KNOBS = {"LR": (0.001, 0.1), "WD": (0.0, 0.5), "DEPTH": (2, 16), "WARMUP": (0.0, 0.2)}


def build_lab(root: Path, n: int) -> Path:
    from nightlab.lab import InitOptions, Lab, init_lab

    target = root / "target"
    target.mkdir()
    (target / "train.py").write_text(TRAIN)
    lab_dir = init_lab(root / "lab", InitOptions(target=target, cpu_slots=1))
    with Lab.open(lab_dir) as lab:
        lab.ledger.register_workers([("cpu-0", "cpu", "local", {})])
        names = list(KNOBS)
        made = 0
        i = 0
        while made < n:
            name = names[i % len(names)]
            lo, hi = KNOBS[name]
            value = lo + (hi - lo) * ((i * 0.618) % 1)
            text = str(int(value)) if isinstance(lo, int) else f"{value:.6g}"
            repeats = 2 if i % 10 == 0 else 1
            exps = lab.submit(
                f"{name} {text}", sets={name: text}, repeats=repeats, start_controller=False, force=True
            )
            for e in exps:
                attempt = lab.ledger.lease_next("cpu-0", "cpu")
                crash = i % 13 == 0
                lab.ledger.finish_attempt(
                    attempt.id,
                    outcome="crash:exception" if crash else "ok",
                    exit_code=1 if crash else 0,
                    metrics={} if crash else {"val_bpb": 1.0 + 0.01 * math.sin(i)},
                )
                lab.ledger.set_verdict(e.id, "crash" if crash else ("discard" if i % 3 else "within-noise"))
            made += len(exps)
            i += 1
    return lab_dir


def per_idea_git_show(lab) -> int:
    """The obvious way: for each idea, `git show` the snapshot's and the parent's train.py."""
    from nightlab.agent.changes import summarize_change

    firsts = {}
    for e in lab.ledger.experiments():
        firsts.setdefault(e.identity, e)
    for e in firsts.values():
        old = subprocess.run(
            ["git", "show", f"{e.parent}:train.py"], cwd=lab.path, capture_output=True, text=True
        )
        new = subprocess.run(
            ["git", "show", f"{e.snapshot}:train.py"], cwd=lab.path, capture_output=True, text=True
        )
        summarize_change(old.stdout, new.stdout)
    return len(firsts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=900, help="experiments in the ledger")
    args = parser.parse_args()
    from nightlab.agent.journal import build_journal
    from nightlab.agent.prompt import CHARS_PER_TOKEN, PROMPT_TOKEN_BUDGET, build_prompt
    from nightlab.lab import Lab

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        lab_dir = build_lab(Path(tmp), args.n)
        print(f"setup: {args.n} experiments recorded in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        with Lab.open(lab_dir) as lab:
            t0 = time.perf_counter()
            journal = build_journal(lab)
            t_batch = time.perf_counter() - t0
            t0 = time.perf_counter()
            ideas = per_idea_git_show(lab)
            t_show = time.perf_counter() - t0
            full = journal.to_text()
            short = journal.to_text(max_chars=40_000)
            t0 = time.perf_counter()
            prompt = build_prompt(lab, session=2, reason="stall")
            t_prompt = time.perf_counter() - t0
    print(f"{'what':<46} {'value':>12}")
    print(f"{'experiments / distinct snapshots':<46} {args.n:>6} / {ideas:<5}")
    print(f"{'build_journal (one git cat-file --batch)':<46} {t_batch:>10.2f} s")
    print(f"{'diff summaries via 2 git show per idea':<46} {t_show:>10.2f} s")
    print(f"{'journal text, full':<46} {len(full):>8} chars")
    print(f"{'journal text, condensed to 40k':<46} {len(short):>8} chars")
    print(f"{'build_prompt (state + condensed journal)':<46} {t_prompt:>10.2f} s ({len(prompt)} chars)")
    tokens = len(prompt) // CHARS_PER_TOKEN
    print(f"{'prompt tokens (chars / 4) vs budget':<46} {tokens:>8} / {PROMPT_TOKEN_BUDGET}")


if __name__ == "__main__":
    main()
