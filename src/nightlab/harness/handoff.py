"""The one call that ends a run of the built-in target: hand the trained model to the harness.

`hand_in(model, batches)` exports the model with `torch.export` (static shapes: one batch of the
profile's rows), saves it in torch.export's `.pt2` format next to the training clock's figures,
tells the harness's batch server it is done, and returns. Inside the fleet the supervisor copies the
hand-in out of the run's reach at that moment (later writes change nothing) and refuses it when it
comes later than a short grace after the last batch served (`serve.grace_seconds`). The fleet's supervisor (`attempt.py`) then scores the saved program in a fresh process
that imports none of the lab's Python (`scorer.py`), with the validation data the training process
could not read. Run by hand (`python train.py`, no supervisor), `hand_in` starts that scorer itself
and returns its result, so the same file works in and out of the fleet.

What a model must avoid to stay exportable (`torch.export`, non-strict mode):
- Python control flow on tensor values (`if x.sum() > 0:`); branch with `torch.where`.
- kernels that are not PyTorch operators (hub-loaded FA3): use SDPA (`ATTENTION = "sdpa"`).
- `torch.compile`d modules: hand in the eager module (the template hands in `model`, not
  `train_model`).
- the forward must accept one (B, T) int64 tensor and return logits (B, T, >= vocab_size).
A model that cannot be exported fails the run with one `ModelNotExportableError` line naming the fix.

Cost on the 2-core dev box (cpu profile, depth 2): export 2.3 s, save 1.0 s (bench/harness_scoring.py
records the figures per run).

Usage (the end of train.py):
    result = hand_in(model, batches)   # None inside the fleet; the scorer's result by hand
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nightlab.atomic import atomic_path, atomic_write_json
from nightlab.errors import NightlabError
from nightlab.harness.names import HANDOFF_ENV, HANDOFF_META, ISOLATED, MODEL_FILE, SCORE_FILE

__all__ = [
    "HandIn",
    "ModelNotExportableError",
    "export_model",
    "hand_in",
]

FORMAT = 1


class ModelNotExportableError(NightlabError):
    """torch.export cannot capture the model: the harness cannot score it apart from train.py."""


@dataclass(frozen=True)
class HandIn:
    """What `hand_in` did: where the model went, what exporting cost, and (by hand) the score."""

    folder: Path
    export_seconds: float
    save_seconds: float
    score: dict[str, Any] | None  # the scorer's result when run by hand; None inside the fleet


def export_model(model: Any, example: Any) -> Any:
    """`torch.export.export(model, (example,))` with a one-line error naming the fix.

    Raises:
        ModelNotExportableError: tracing failed (data-dependent control flow, foreign kernels, ...).
    """
    import torch

    was_training = getattr(model, "training", False)
    model.eval()
    try:
        with torch.no_grad():
            return torch.export.export(model, (example,), strict=False)
    except Exception as e:  # export raises many types; every one means "not capturable"
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise ModelNotExportableError(
            f"torch.export could not capture the model ({type(e).__name__}: {first}); keep forward() free "
            'of Python branches on tensor values and of non-PyTorch kernels (set ATTENTION = "sdpa"), and '
            "hand in the eager module, not a torch.compile'd one"
        ) from e
    finally:
        model.train(was_training)


def hand_in(model: Any, batches: Any, *, batch_size: int | None = None, folder: Path | None = None) -> HandIn:
    """Export the trained model for the harness's scorer; outside the fleet, score it too.

    Args:
        model: the trained `nn.Module`; `model(x)` with x (B, T) int64 returns logits (B, T, >= V).
        batches: the `clock.TrainingClock` the run trained from; its figures become the run's
            harness-owned timing keys (`training_seconds`, `warmup_seconds`, ...).
        batch_size: rows per scoring pass (static in the exported program); default the clock's
            training batch size, which the model is known to fit.
        folder: where to write (and nothing more); default `$NIGHTLAB_HANDOFF_DIR`, else
            `./.nightlab-handoff`, which is then scored by hand.

    Returns:
        A `HandIn`; its `score` is the scorer's result when neither `folder` nor a supervisor is given.

    Raises:
        ModelNotExportableError: the model cannot be exported (the message names the fix).
    """
    import torch

    from nightlab.harness.clock import TrainingClock

    if not isinstance(batches, TrainingClock):
        raise NightlabError(
            "hand_in needs the harness's training clock: build batches with "
            "`nightlab.harness.clock.training_batches(...)` and pass that object"
        )
    figures = batches.figures()
    rows = int(batch_size or batches.batch_size)
    seq_len = batches.seq_len
    by_hand = folder is None and not os.environ.get(HANDOFF_ENV)  # no supervisor will score it
    out = Path(folder or os.environ.get(HANDOFF_ENV) or ".nightlab-handoff")
    out.mkdir(parents=True, exist_ok=True)
    device = next((p.device for p in model.parameters()), torch.device(batches.device))
    example = torch.zeros((rows, seq_len), dtype=torch.int64, device=device)

    start = time.perf_counter()
    program = export_model(model, example)
    exported = time.perf_counter()
    with atomic_path(out / MODEL_FILE) as tmp:  # keeps the .pt2 suffix torch.export.save wants
        torch.export.save(program, tmp)
    saved = time.perf_counter()
    meta = {
        "format": FORMAT,
        "batch_size": rows,
        "seq_len": seq_len,
        "device": str(device),
        "clock": figures.to_dict(),
        "export_seconds": round(exported - start, 3),
        "save_seconds": round(saved - exported, 3),
        "seed": batches.seed,
        "torch": torch.__version__,
    }
    atomic_write_json(out / HANDOFF_META, meta, indent=1)
    # the moment of the hand-in, on the server's clock: inside the fleet the supervisor copies the
    # folder out of this process's reach now, and refuses a hand-in later than its grace allows
    batches.hand_in()
    print(
        f"handed in: {out / MODEL_FILE} (export {exported - start:.1f} s, save {saved - exported:.1f} s)",
        flush=True,
    )
    score = _score_by_hand(out) if by_hand else None
    return HandIn(out, exported - start, saved - exported, score)


def _score_by_hand(folder: Path) -> dict[str, Any]:
    """Run the scorer as the fleet would (a fresh process), on the lab found from the cwd."""
    from nightlab.harness.profiles import load_lab_profile

    load_lab_profile()  # fail here, with its message, when the cwd is not a lab
    result = folder / SCORE_FILE
    proc = subprocess.run(
        [sys.executable, *ISOLATED, "-m", "nightlab.harness.scorer", "--handoff", str(folder),
         "--lab", str(Path.cwd()), "--out", str(result)],
        env={k: v for k, v in os.environ.items() if k != HANDOFF_ENV},
    )  # fmt: skip
    if proc.returncode != 0 or not result.exists():
        raise NightlabError(f"the harness scorer failed (exit {proc.returncode}); its error is above")
    return json.loads(result.read_text())
