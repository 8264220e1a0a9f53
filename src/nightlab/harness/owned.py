"""Harness-owned summary keys: the ledger takes them from the scorer's file, never from train.py.

The supervisor (`attempt.py`) writes `score.json` in the attempt's folder, where the run cannot
write. `apply_score` turns the runner's classification of the log (`fleet.runner.classify`)
into the recorded outcome:

    score.json                      outcome
    any, run timed out/lost/cancel  the runner's class (timeout, infra, cancelled): a run that never
                                    finished has no score; a remote one's last line may be train.py's
    missing, run crashed            the runner's class (crash:*)
    missing, run exited 0           invalid: "no harness score" (the supervisor never finished)
    status not-scored               the runner's class (the training process failed)
    status invalid                  invalid, with the supervisor's or scorer's reason
    status ok, val_bpb finite       ok; crash:nan when the metric is NaN / inf
    status ok, another val_set      invalid: scored on another validation set than the lab's

The owned keys in the result are the scorer's; what train.py printed for them is dropped, and
where it disagrees the first disagreement is kept as `harness_warning` (shown by `show`) so a reader
sees that the run tried. `scored_by = harness` marks a number the harness vouches for;
`sandbox = none` marks a run the sandbox did not contain.

stdlib only: the controller imports this on its hot path.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from nightlab.harness.names import SCORE_FILE

__all__ = ["OWNED_KEYS", "TRUST_NOTES", "apply_score", "read_score", "seed_ignored", "trust"]

# keys only the harness may set (train.py's values for them are ignored)
OWNED_KEYS = (
    "val_bpb",
    "training_seconds",
    "budget_seconds",  # the run's rung: its tier's budget (`nightlab.rungs`)
    "warmup_seconds",
    "warmup_steps",
    "data_fingerprint",
    "val_set",
    "status",
    "invalid_reason",
    "eval_tokens",
    "eval_seconds",
    "probe_rows",
    "sandbox",
    "unsandboxed",
    "train_wall_seconds",
    "wall_limit_seconds",
    "export_seconds",
    "handin_delay_seconds",
    "handin_grace_seconds",
    "batches_served",
    "warmup_batches",
    "scored_by",
    "seed_warning",
    "harness_warning",
    "hint",
)
# ends where the supervisor did not finish: whatever score there is, it is not the harness's verdict
_UNFINISHED = ("timeout", "infra", "cancelled")
# owned keys train.py may print, compared with the harness's figure (relative tolerance)
_COMPARED = {"val_bpb": 1e-6, "training_seconds": 0.05, "data_fingerprint": 0.0}


def read_score(run_dir: Path) -> dict[str, Any] | None:
    """The supervisor's result for an attempt, or None when there is none (or it is unreadable)."""
    try:
        data = json.loads((Path(run_dir) / SCORE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _disagreement(printed: dict[str, Any], score: dict[str, Any]) -> str | None:
    for key, tolerance in _COMPARED.items():
        if key not in printed:
            continue
        mine, theirs = score.get(key), printed[key]
        if mine is None:  # the harness has no figure to compare (an invalid run stops early)
            continue
        if isinstance(mine, (int, float)) and isinstance(theirs, (int, float)):
            if math.isclose(float(mine), float(theirs), rel_tol=tolerance, abs_tol=0.05 if tolerance else 0):
                continue
        elif str(mine) == str(theirs):
            continue
        return f"train.py printed {key} = {theirs}, the harness measured {mine}; the harness's figure is recorded"
    return None


def apply_score(
    outcome: str,
    detail: str | None,
    metrics: dict[str, Any],
    score: dict[str, Any] | None,
    *,
    metric: str,
    expected_val_set: str | None = None,
) -> tuple[str, str | None, dict[str, Any]]:
    """The recorded (outcome, detail, metrics) of a built-in-target attempt (see the module table).

    Args:
        outcome, detail, metrics: what `classify` made of the exit code and the log.
        score: `read_score(run_dir)`.
        metric: the lab's metric key.
        expected_val_set: the lab's validation set (`fleet.runner.expected_val_set`); a score
            from another one (or none) is `invalid`, so two sets are never pooled.
    """
    printed = dict(metrics)
    kept = {k: v for k, v in metrics.items() if k not in OWNED_KEYS}
    if outcome in _UNFINISHED:
        return outcome, detail, kept
    if score is None:
        if outcome in ("ok", "invalid") or outcome == "crash:no-summary":
            return "invalid", "no harness score for this run (the supervisor did not finish)", kept
        return outcome, detail, kept
    owned = {k: v for k, v in score.items() if k in OWNED_KEYS and isinstance(v, (int, float, str))}
    owned["scored_by"] = "harness"
    status = score.get("status")
    if status == "not-scored":  # the training process failed: the log's class stands
        return outcome, score.get("hint") or detail, {**kept, **owned}
    result = {**kept, **owned}
    warning = _disagreement(printed, score)
    if warning:
        result["harness_warning"] = warning
    if status != "ok":
        return "invalid", str(score.get("invalid_reason") or "the harness refused the run"), result
    if expected_val_set is not None and score.get("val_set") != expected_val_set:
        return (
            "invalid",
            f"scored on validation set `{score.get('val_set')}`, the lab's is `{expected_val_set}`; "
            "run `nightlab fleet up --relaunch` so the worker's set-up takes the lab's",
            result,
        )
    value = score.get(metric)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return "crash:nan", f"metric `{metric}` is {value}", result
    return "ok", warning, result


TRUST_NOTES = {
    "harness": "scored by the harness, in the sandbox",
    "unsandboxed": "scored by the harness, but train.py ran without the sandbox (install bubblewrap)",
    "self-reported": "the target computed this figure itself; the harness vouches for nothing",
}


def trust(metrics: dict[str, Any], *, builtin: bool) -> str:
    """Who vouches for a result's figures: `harness`, `unsandboxed` or `self-reported`.

    A foreign target's numbers are always self-reported; a built-in-target result is the harness's
    only when its scorer wrote it (`scored_by`), and `unsandboxed` when train.py ran outside the
    sandbox (so it could have read the validation split or rewritten files).
    """
    if not builtin or metrics.get("scored_by") != "harness":
        return "self-reported"
    return "unsandboxed" if metrics.get("sandbox") == "none" else "harness"


def seed_ignored(seed: int, value: float, siblings: list[tuple[int, float]]) -> str | None:
    """A warning when another seed of the same snapshot scored exactly the same, else None.

    Seeds change the init and the data order, so two seeds never agree to 6 decimals of val_bpb
    by chance: a run that does ignores `NIGHTLAB_SEED` (or fixes its own), and its repeats measure
    nothing about the noise.

    Args:
        seed, value: this run's seed and metric.
        siblings: (seed, metric) of the snapshot's other ok runs on the same tier.
    """
    for other_seed, other in siblings:
        if other_seed != seed and other is not None and round(other, 6) == round(value, 6):
            return (
                f"seed {seed} scored exactly what seed {other_seed} scored ({value:.6f}): "
                "the run ignores NIGHTLAB_SEED or sets its own"
            )
    return None
