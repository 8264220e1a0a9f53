"""The metric: validation bits per byte, computed by the harness from the model's logits.

DO NOT CHANGE without bumping the data format: every result in every lab is measured here.

val_bpb = (sum over scored targets of the cross-entropy in nats) / (ln 2 * sum of their UTF-8
byte lengths). Dividing by bytes instead of tokens makes the number independent of the
tokenizer: a bigger vocabulary predicts fewer, harder tokens for the same text, and the two
effects cancel. Special tokens (BOS, 0 bytes) are left out of both sums. The sequence length
is pinned by the profile because the loss of a token depends on how much context precedes it;
a shorter context would score worse text, a longer one better.

The model only supplies logits `model(x) -> (B, T, >= vocab_size)`; the harness computes the
cross-entropy, so a model cannot report a loss of its own choosing. Logit columns past the
vocabulary (padding for efficient matmuls) are dropped.

Before scoring, `causality_probe` checks that the logits at positions <= t do not change when the
tokens after t change (in every row, so mixing across the batch is caught as well). A model
that peeks at the future scores an impossible val_bpb; the result carries `invalid_reason`, and
train.py prints it in the summary (`status: invalid`), which the fleet records as `invalid`.

Usage:
    result = evaluate(model, profile, batch_size=32, device="cuda", autocast=accel.autocast)
    result.val_bpb, result.invalid_reason
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nightlab.errors import NightlabError

if TYPE_CHECKING:
    from nightlab.harness.profiles import Profile

__all__ = ["EvalResult", "bits_per_byte", "causality_probe", "evaluate"]

# Positions probed: the middle and the second-to-last (a model that leaks only near the end of
# the row is caught by the second, one that leaks everywhere by the first).
_PROBE_FRACTIONS = (0.5, 1.0)


@dataclass(frozen=True)
class EvalResult:
    """The outcome of `evaluate`.

    Attributes:
        val_bpb: bits per byte over the profile's eval tokens, as measured; None when the logits
            have the wrong shape. Meaningless when `invalid_reason` is set (a leak makes it too good).
        invalid_reason: why the result cannot be trusted (e.g. not causal); None when valid.
        tokens: target tokens scored (special tokens included in the count, not in the metric).
        seconds: wall-clock time of the probe plus the scoring.
    """

    val_bpb: float | None
    invalid_reason: str | None
    tokens: int
    seconds: float


def _logits(model: Callable, x: Any, vocab_size: int) -> Any:
    """Call the model and check the shape of what it returns. Returns fp32 (B, T, vocab_size)."""
    out = model(x)
    shape = tuple(getattr(out, "shape", ()))
    if len(shape) != 3 or shape[:2] != tuple(x.shape) or shape[2] < vocab_size:
        raise _Invalid(
            f"model(x) must return logits of shape (B, T, >= {vocab_size}) for x of shape "
            f"{tuple(x.shape)}; got {shape or type(out).__name__}"
        )
    return out[..., :vocab_size].float()


class _Invalid(Exception):
    """The model's output cannot be scored; the message is the reason."""


def causality_probe(
    model: Callable, x: Any, vocab_size: int, *, autocast: Callable[[], Any] = contextlib.nullcontext
) -> str | None:
    """Check that changing the tokens after position t leaves the logits up to t unchanged.

    Args:
        model: called as `model(x)`, returning logits (B, T, >= vocab_size).
        x: a sample batch of token ids, int64 (B, T).
        vocab_size: the tokenizer's vocabulary size (replacement tokens are drawn below it).
        autocast: returns the precision context to call the model in.

    Returns:
        None when the model passes, else the reason it is not causal (one line).
    """
    import torch

    T = x.size(1)
    gen = torch.Generator().manual_seed(1234)
    with torch.no_grad(), autocast():
        try:
            reference = _logits(model, x, vocab_size)
            if not torch.isfinite(reference).all():  # not a causality question: val_bpb will be NaN
                return None
            for fraction in _PROBE_FRACTIONS:
                t = min(T - 2, int(fraction * (T - 1)))
                changed = x.clone()
                noise = torch.randint(0, vocab_size, (x.size(0), T - t - 1), generator=gen)
                changed[:, t + 1 :] = noise.to(x.device)
                probed = _logits(model, changed, vocab_size)
                diff = (probed[:, : t + 1] - reference[:, : t + 1]).abs().max().item()
                # Kernels are deterministic for identical shapes; the slack covers reduced-precision
                # kernels that tile differently when the inputs change (~1e-3 relative in bf16).
                tolerance = 1e-3 * max(1.0, reference.abs().max().item())
                if not diff <= tolerance:
                    return (
                        f"model is not causal: logits at positions <= {t} changed by {diff:.3g} "
                        f"(tolerance {tolerance:.1g}) when only the tokens after {t} changed"
                    )
        except _Invalid as e:
            return str(e)
    return None


def bits_per_byte(
    model: Callable,
    batches: Iterable[tuple[Any, Any]],
    token_bytes: Any,
    *,
    autocast: Callable[[], Any] = contextlib.nullcontext,
) -> tuple[float, int]:
    """Bits per byte of the model's predictions over the given (x, y) batches.

    Args:
        model: called as `model(x)`, returning logits (B, T, >= vocab_size).
        batches: (x, y) pairs of int64 (B, T) token ids; y is x shifted by one.
        token_bytes: int tensor (vocab_size,), UTF-8 length of each token, 0 for special tokens.
        autocast: returns the precision context to call the model in.

    Returns:
        (val_bpb, number of target tokens seen).

    Raises:
        NightlabError: the batches hold no scored byte.
    """
    import torch
    import torch.nn.functional as F

    vocab_size = token_bytes.numel()
    total_nats = torch.zeros((), dtype=torch.float64, device=token_bytes.device)
    total_bytes = torch.zeros((), dtype=torch.int64, device=token_bytes.device)
    tokens = 0
    with torch.no_grad():
        for x, y in batches:
            with autocast():
                logits = _logits(model, x, vocab_size)
            nats = F.cross_entropy(logits.view(-1, vocab_size), y.reshape(-1), reduction="none")
            nbytes = token_bytes[y.reshape(-1)]
            total_nats += (nats * (nbytes > 0)).sum(dtype=torch.float64)
            total_bytes += nbytes.sum()
            tokens += y.numel()
    if total_bytes.item() == 0:
        raise NightlabError(
            "no scored bytes in the validation batches; the eval set is empty or all special tokens. "
            "Re-run `nightlab prepare`"
        )
    return (total_nats / (math.log(2) * total_bytes)).item(), tokens


def evaluate(
    model: Callable,
    profile: Profile,
    *,
    batch_size: int,
    device: str,
    autocast: Callable[[], Any] = contextlib.nullcontext,
    data_dir: Path | None = None,
) -> EvalResult:
    """Probe the model for causality, then score it on the profile's fixed validation tokens.

    The sequence length and the number of eval tokens come from the profile, never from the caller.

    Args:
        model: called as `model(x)`, returning logits (B, T, >= vocab_size).
        profile: the lab's profile (`nightlab.harness.profiles.load_lab_profile()`).
        batch_size: rows per forward pass (memory, not the metric, depends on it).
        device: where the batches go ("cuda", "cpu", ...).
        autocast: returns the precision context to call the model in.
        data_dir: the prepared data directory; default `profiles.data_dir(profile)`.

    Returns:
        An `EvalResult`; `invalid_reason` is set when the model fails the probe or returns logits
        of the wrong shape (then `val_bpb` is None).

    Raises:
        DataNotPreparedError: the data directory was never prepared.
    """
    import torch

    from nightlab.harness.loader import val_batches
    from nightlab.harness.profiles import data_dir as default_data_dir
    from nightlab.harness.tokenizer import Tokenizer

    start = time.perf_counter()
    data_dir = Path(data_dir) if data_dir is not None else default_data_dir(profile)
    token_bytes = torch.as_tensor(Tokenizer.load(data_dir).token_bytes, dtype=torch.int64, device=device)
    vocab_size = token_bytes.numel()
    batches = iter(val_batches(data_dir, batch_size, profile.seq_len, device, profile.eval_tokens))
    first = next(batches, None)
    if first is None:
        raise NightlabError(f"no validation batches in `{data_dir}`; re-run `nightlab prepare`")
    reason = causality_probe(model, first[0], vocab_size, autocast=autocast)

    def all_batches() -> Iterable[tuple[Any, Any]]:
        yield first
        yield from batches

    # A model that fails the probe is still scored: the (too good) number shows what the leak is
    # worth, and the invalid reason travels with it so the fleet records `invalid`, not a result.
    try:
        val_bpb, tokens = bits_per_byte(model, all_batches(), token_bytes, autocast=autocast)
    except _Invalid as e:  # wrong logit shape: nothing to score
        return EvalResult(None, reason or str(e), 0, time.perf_counter() - start)
    return EvalResult(val_bpb, reason, tokens, time.perf_counter() - start)
