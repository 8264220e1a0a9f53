"""The names the harness's processes agree on, and how they leave: a leaf module (stdlib only).

The supervisor (`attempt.py`), the hand-in (`handoff.py`, imported by train.py) and the scorer
(`scorer.py`) run as separate processes and meet only in files and in how they start Python; they
share these names without importing each other (which once made the three a cycle).
"""

from __future__ import annotations

import os
import sys

# How harness processes start Python so that no file of the lab can shadow a module: `-P` keeps the
# working directory (the snapshot) off sys.path and still honours PYTHONPATH, which comes from the
# user's environment, never from the run.
ISOLATED = ("-P",)

SCORE_FILE = "score.json"  # the supervisor's result in the run's folder, and the scorer's `--out`
HANDOFF_FOLDER = "handoff"  # where train.py hands its model in (a run folder's subfolder)
RECEIVED_FOLDER = "handed-in"  # the hand-in as it was when train.py handed it in
HANDOFF_ENV = "NIGHTLAB_HANDOFF_DIR"  # set by the supervisor: where the model goes
MODEL_FILE = "model.pt2"
HANDOFF_META = "handoff.json"

# Variables that change what a run measures (budget, steps, eval, the supervisor's test-only
# widenings of its clock). Only the controller may give a run one (a rung's budget); the fleet
# strips them from a shell that has them set and refuses a worker YAML that sets them.
MEASUREMENT_OVERRIDES = (
    "NIGHTLAB_BUDGET",
    "NIGHTLAB_MAX_STEPS",
    "NIGHTLAB_SKIP_EVAL",
    "NIGHTLAB_TIER_BUDGET",
    "NIGHTLAB_HANDIN_GRACE",
    "NIGHTLAB_WALL_ALLOWANCE",
)


def exit_now(code: int) -> None:
    """Leave at once: flush and `os._exit`, skipping the interpreter's teardown.

    With torch loaded, Python's finalisation took 0.78 s after the last line of `main` (measured,
    2-core box): time every run would wait for. Everything the process writes is complete by
    then (files are written whole and renamed: `nightlab/atomic.py`), so there is nothing left for
    the teardown to do.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
