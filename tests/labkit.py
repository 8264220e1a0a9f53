"""Test kit: the synthetic target and helpers to drive the real CLI.

The synthetic target is a tiny train.py whose knobs choose its behaviour (sleep time,
metric as a known function of LR, failure modes), so fleet tests are fast and exact.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

SYNTHETIC_TRAIN = '''\
"""Synthetic target: prints a summary block after a short sleep."""
import math
import os
import sys
import time

LR = 0.01  # learning rate: the metric is best at 0.02
SLEEP = 0.2  # seconds of "training"
MODE = "ok"  # ok | crash | syntax | nan | oom | garbage | nothing | partial | hang | big | selfkill | exit3
NOISE = 0.0  # standard deviation of the seeded noise
GATE = ""  # a file the run waits for before its sleep (tests that must catch a run in flight)

seed = int(os.environ.get("NIGHTLAB_SEED", "0"))
while GATE and not os.path.exists(GATE):
    time.sleep(0.05)
start = time.time()
if MODE == "hang":
    time.sleep(3600)
if MODE == "big":
    line = "x" * 1023 + "\\n"
    for _ in range(100 * 1024):
        sys.stdout.write(line)
time.sleep(SLEEP)
if MODE == "crash":
    raise ValueError("boom at step 3")
if MODE == "oom":
    raise MemoryError("cannot allocate 1 TiB")
if MODE == "nan":
    print("FAIL: loss is nan at step 12")
    sys.exit(1)
if MODE == "garbage":
    print("\\x00\\x01 nothing to see %%% ---- : :")
    sys.exit(0)
if MODE == "nothing":
    sys.exit(0)
if MODE == "exit3":
    sys.exit(3)
if MODE == "selfkill":
    import signal
    os.kill(os.getpid(), signal.SIGSEGV)
noise = NOISE * math.sin(12.9898 * (seed + 1)) * 1.7
metric = 1.0 + 10 * (math.log10(LR) - math.log10(0.02)) ** 2 + noise
print("step 1 loss 3.0\\r step 2 loss 2.5\\r", end="")
print("\\x1b[32mdone\\x1b[0m")
print("---")
if MODE != "partial":
    print(f"val_bpb:          {metric:.6f}")
print(f"training_seconds: {SLEEP:.1f}")
print(f"peak_vram_mb:     {2048.0 + 1024 * LR:.1f}")
print(f"start_ts:         {start:.6f}")
print(f"end_ts:           {time.time():.6f}")
print(f"env_budget:       {os.environ.get('NIGHTLAB_BUDGET', 'none')}")
print(f"env_loosened:     {sum(k in os.environ for k in ('NIGHTLAB_HANDIN_GRACE', 'NIGHTLAB_WALL_ALLOWANCE'))}")
print(f"env_experiment:   {os.environ.get('NIGHTLAB_EXPERIMENT', 'none')}")
print(f"env_seed:         {seed}")
print(f"env_tier:         {os.environ.get('NIGHTLAB_TIER', 'none')}")
'''


def nightlab(
    *args: str, cwd: Path, check: bool = True, timeout: float = 120, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user (or an agent) would."""
    proc = subprocess.run(
        [sys.executable, "-m", "nightlab", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"nightlab {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
}


def commit(lab: Path, message: str = "test edit", *paths: str) -> None:
    """Commit the lab's tracked edits (or just `paths`) as a test user."""
    args = ["git", "commit", "-q", "--no-verify", "-m", message, *(["--", *paths] if paths else ["-a"])]
    subprocess.run(args, cwd=lab, check=True, env={**os.environ, **GIT_ENV})


def wait_json(lab: Path, *ids: str, timeout: float = 60) -> list[dict]:
    proc = nightlab("wait", *ids, "--timeout", str(timeout), "--json", cwd=lab)
    return json.loads(proc.stdout)


def wait_until(predicate, timeout: float = 30, interval: float = 0.05, what: str = "the condition"):
    """The tests' one polling loop: `predicate()`'s first truthy value, asked every `interval` s;
    AssertionError naming `what` when it is still falsy after `timeout` s (asked once more at the end)."""
    deadline = time.time() + timeout
    while True:
        value = predicate()
        if value or time.time() >= deadline:
            break
        time.sleep(interval)
    if not value:
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
    return value
