"""Device layer: which device, precision, attention kernel and compile policy a run uses.

`train.py` asks for one `Accel` (`detect()`) and never branches on the device itself, so the
editable file stays readable and every hardware footgun lives here, with its reason:

- Precision: bf16 autocast on CUDA / ROCm GPUs with compute capability >= 8.0 (the tensor
  cores' native format); fp32 everywhere else. On CPU bf16 autocast trains far slower than
  fp32 (the autocast casts and the non-fused kernels dominate), and MPS / pre-Ampere GPUs have
  no fast bf16 path.
- Attention: Flash-Attention-3 only on compute capability 9.0 (Hopper), only when its kernel
  (`flash_attn_interface`) is installed, and only after a one-call probe agrees with SDPA; FA3
  crashes on other architectures (the RTX 5090 lesson). Everywhere else PyTorch SDPA with
  `is_causal=True` and no explicit mask: a masked SDPA call never takes the flash / cuDNN
  backend. Sliding windows are therefore used only with FA3; on SDPA every layer gets the full
  causal window (what the 5090 port did: "SSSL" without FA3 was slower than "LLLL").
- Compile: the optimizer's per-group steps are compiled on CUDA (cheap, always a win). The
  full model is compiled by default on NVIDIA sm80..sm90 and ROCm; not on consumer Blackwell
  (sm120, where the full-model compile was broken), not on CPU / MPS. Any compile error falls
  back to eager with one warning. "Works" is not "fast": `nightlab tune` measures the options.
- Peak FLOPs: dense bf16 with fp32 accumulation per device, from an ordered table. An unknown
  device gives None (MFU n/a), never the H100 number. `NIGHTLAB_PEAK_FLOPS` overrides it.

Usage:
    accel = detect(attention="auto", compile="auto")
    with accel.autocast():
        y = accel.attention(q, k, v, window)   # (B, T, H, D) in and out

Importing this module does not import torch; `peak_flops` works without it.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nightlab.errors import UsageError

__all__ = ["ATTENTION_CHOICES", "COMPILE_CHOICES", "Accel", "available_attention", "detect", "peak_flops"]

ATTENTION_CHOICES = ("auto", "fa3", "sdpa")
COMPILE_CHOICES = ("auto", "on", "off")

# Dense bf16 tensor-core peak with fp32 accumulation, FLOP/s, from the vendors' datasheets.
# Order matters: the first pattern that matches wins, so variants come before the plain name.
# Patterns match whole words of the upper-cased device name: "L4" does not match "L40S",
# "H200" does not match "GH200".
_PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    (r"GH200", 989e12),
    (r"H200", 989e12),
    (r"H100.*\bNVL\b", 835e12),
    (r"H100.*\bPCIE\b", 756e12),
    (r"H100", 989.5e12),  # SXM
    (r"GB200", 2.5e15),
    (r"B200", 2.25e15),
    (r"A100", 312e12),
    (r"A10G", 70e12),
    (r"A10", 125e12),
    (r"L40S", 362e12),
    (r"L40", 181e12),
    (r"L4", 121e12),
    # GeForce cards run fp32-accumulate at half their fp16-accumulate rate; these are the halves.
    (r"RTX 5090", 209.5e12),
    (r"RTX 4090", 165.2e12),
    (r"RTX 3090", 71e12),
    (r"MI325X", 1307.4e12),
    (r"MI300X", 1307.4e12),
)
_PEAK_FLOPS_ENV = "NIGHTLAB_PEAK_FLOPS"


def peak_flops(device_name: str) -> float | None:
    """Dense bf16 peak FLOP/s (fp32 accumulation) of a device, or None if unknown.

    `NIGHTLAB_PEAK_FLOPS` (e.g. `209.5e12`) overrides the table, for devices it lacks.

    Args:
        device_name: what `torch.cuda.get_device_name()` reports, e.g. "NVIDIA H100 80GB HBM3".

    Raises:
        UsageError: `NIGHTLAB_PEAK_FLOPS` is set but is not a positive number.
    """
    override = os.environ.get(_PEAK_FLOPS_ENV)
    if override:
        try:
            value = float(override)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise UsageError(
                f"{_PEAK_FLOPS_ENV}=`{override}` is not a positive number; set it to FLOP/s, e.g. 209.5e12"
            )
        return value
    name = device_name.upper()
    for pattern, flops in _PEAK_FLOPS:
        if re.search(rf"(?<![A-Z0-9]){pattern}(?![A-Z0-9])", name):
            return flops
    return None


@dataclass(frozen=True)
class Accel:
    """What one run uses on this machine. Built by `detect()`; immutable.

    Attributes:
        device: torch device string: "cuda", "mps" or "cpu".
        device_name: human name ("NVIDIA H100 80GB HBM3", "cpu (2 threads)").
        dtype: the matmul dtype under autocast (torch.bfloat16 or torch.float32).
        attention_backend: "fa3" or "sdpa".
        compile_model: whether to torch.compile the whole model (with eager fallback).
        compile_optimizer: whether to torch.compile the optimizer's step functions.
        peak_flops: dense bf16 peak FLOP/s, None when unknown (MFU is then n/a).
        warmup_steps: first training steps left out of the time budget (compile, allocator).
    """

    device: str
    device_name: str
    dtype: Any
    attention_backend: str
    compile_model: bool
    compile_optimizer: bool
    peak_flops: float | None
    warmup_steps: int
    _attention: Callable[..., Any] = field(repr=False, compare=False)

    @property
    def windows_supported(self) -> bool:
        """Whether sliding windows are honoured (else every layer attends to the full context)."""
        return self.attention_backend == "fa3"

    def attention(self, q: Any, k: Any, v: Any, window: int) -> Any:
        """Causal attention. q, k, v: (B, T, H, D); window: tokens visible to the left, -1 = all.

        Returns (B, T, H, D) in `dtype`. On SDPA the window is ignored (full causal attention).
        """
        # Under autocast, norms may return fp32 and embeddings are fp32 while linears give bf16;
        # the kernels need one dtype, and FA3 needs bf16.
        q, k, v = q.to(self.dtype), k.to(self.dtype), v.to(self.dtype)
        return self._attention(q, k, v, window)

    def autocast(self) -> contextlib.AbstractContextManager:
        """The precision context for forward passes (bf16 autocast, or nothing for fp32)."""
        import torch

        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device, dtype=self.dtype)

    def synchronize(self) -> None:
        """Wait for queued device work, so wall-clock timings mean something."""
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
        elif self.device == "mps":
            torch.mps.synchronize()

    def compile_fn(self, fn: Callable) -> Callable:
        """Compile an optimizer step function when the policy says so (else return it unchanged).

        Compilation happens on the first call; if that call fails, `fn` runs eagerly from then on,
        with one warning. Later errors propagate (they are the function's own).
        """
        import torch

        if not self.compile_optimizer:
            return fn
        compiled = torch.compile(fn, dynamic=False, fullgraph=True)
        current = [None]  # the callable in use once the first call settled it

        def call(*args: Any) -> Any:
            if current[0] is not None:
                return current[0](*args)
            try:
                result = compiled(*args)
                current[0] = compiled
            except Exception as e:  # a dynamo / inductor error: compilation fails before running
                warnings.warn(
                    f"torch.compile of `{getattr(fn, '__name__', fn)}` failed "
                    f"({type(e).__name__}: {str(e).splitlines()[0][:200]}); running it eagerly",
                    stacklevel=2,
                )
                current[0] = fn
                result = fn(*args)
            return result

        return call

    def maybe_compile_model(self, model: Any, probe: Callable[[Any], None]) -> tuple[Any, bool]:
        """Compile `model` if the policy says so, proving it works with `probe(compiled)`.

        torch.compile fails lazily, on the first call, so `probe` (e.g. one forward + backward on a
        sample batch) runs here; any exception falls back to the eager model with one warning.

        Returns:
            (the module to call, whether it is compiled).
        """
        import torch

        if not self.compile_model:
            return model, False
        compiled = torch.compile(model, dynamic=False)
        try:
            probe(compiled)
            return compiled, True
        except Exception as e:  # an inductor / dynamo error of any kind: eager still works
            warnings.warn(
                f"full-model torch.compile failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                "running eager. Set COMPILE = 'off' in train.py to skip the attempt.",
                stacklevel=2,
            )
            return model, False

    def peak_memory_mb(self) -> float:
        """Peak memory of this run in MiB: allocated device memory on CUDA, process peak RSS otherwise."""
        import torch

        if self.device == "cuda":
            return torch.cuda.max_memory_allocated() / 2**20
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes on macOS, KiB on Linux


def _sdpa(q: Any, k: Any, v: Any, window: int) -> Any:
    import torch.nn.functional as F

    # SDPA wants (B, H, T, D); transposed views keep the last dim contiguous, which all backends accept.
    y = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        is_causal=True,
        enable_gqa=q.size(2) != k.size(2),
    )
    return y.transpose(1, 2)


def _load_fa3() -> Callable[..., Any] | None:
    """The FA3 attention function, if its kernel is installed and agrees with SDPA on one call."""
    try:
        import flash_attn_interface  # the Hopper build of flash-attention (FA3)
    except Exception:
        return None
    import torch

    def fa3(q: Any, k: Any, v: Any, window: int) -> Any:
        window_size = (-1, -1) if window < 0 or window >= q.size(1) else (window, 0)
        out = flash_attn_interface.flash_attn_func(q, k, v, causal=True, window_size=window_size)
        return out[0] if isinstance(out, tuple) else out  # older builds also return the LSE

    try:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (
            torch.randn(2, 256, 4, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in "qkv"
        )
        got, want = fa3(q, k, v, -1), _sdpa(q, k, v, -1)
        if (got.float() - want.float()).abs().max().item() > 2e-2:
            warnings.warn("FA3 probe disagrees with SDPA; using SDPA", stacklevel=3)
            return None
    except Exception as e:
        warnings.warn(f"FA3 probe failed ({type(e).__name__}: {e}); using SDPA", stacklevel=3)
        return None
    return fa3


def available_attention() -> list[str]:
    """Attention backends that work on this machine's default device, best first."""
    import torch

    hopper = (
        torch.cuda.is_available()
        and torch.version.hip is None
        and torch.cuda.get_device_capability() == (9, 0)
    )
    return ["fa3", "sdpa"] if hopper and _load_fa3() is not None else ["sdpa"]


def _set_threads() -> None:
    import torch

    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def detect(*, attention: str = "auto", compile: str = "auto") -> Accel:
    """Pick device, precision, attention backend and compile policy for this machine.

    Args:
        attention: "auto" (FA3 where it works, else SDPA), "fa3" (falls back to SDPA with a
            warning where FA3 is unavailable) or "sdpa".
        compile: full-model compile: "auto" (the per-device default above), "on" or "off".

    Raises:
        UsageError: an option is not one of the choices.
    """
    if attention not in ATTENTION_CHOICES:
        raise UsageError(
            f"ATTENTION = `{attention}` is not one of {', '.join(ATTENTION_CHOICES)}; fix train.py"
        )
    if compile not in COMPILE_CHOICES:
        raise UsageError(f"COMPILE = `{compile}` is not one of {', '.join(COMPILE_CHOICES)}; fix train.py")
    import torch

    _set_threads()
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 matmuls outside autocast (optimizer) use TF32
        torch.backends.cudnn.allow_tf32 = True
        name = torch.cuda.get_device_name()
        major, minor = torch.cuda.get_device_capability()
        rocm = torch.version.hip is not None
        bf16 = rocm or major >= 8
        fa3 = None
        if attention != "sdpa" and not rocm and (major, minor) == (9, 0):
            fa3 = _load_fa3()
        if attention == "fa3" and fa3 is None:
            warnings.warn("ATTENTION = 'fa3' but FA3 is unavailable on this GPU; using SDPA", stacklevel=2)
        compile_default = bf16 and major < 12  # consumer Blackwell (sm120): full-model compile broken
        return Accel(
            device="cuda",
            device_name=name,
            dtype=torch.bfloat16 if bf16 else torch.float32,
            attention_backend="fa3" if fa3 is not None else "sdpa",
            compile_model=compile == "on" or (compile == "auto" and compile_default),
            compile_optimizer=True,
            peak_flops=peak_flops(name),
            warmup_steps=10,
            _attention=fa3 or _sdpa,
        )
    if attention == "fa3":
        warnings.warn("ATTENTION = 'fa3' needs a Hopper GPU; using SDPA", stacklevel=2)
    if torch.backends.mps.is_available():
        return Accel(
            "mps", "Apple MPS", torch.float32, "sdpa", compile == "on", False, peak_flops("mps"), 2, _sdpa
        )
    return Accel(
        device="cpu",
        device_name=f"cpu ({torch.get_num_threads()} threads)",
        dtype=torch.float32,
        attention_backend="sdpa",
        compile_model=compile == "on",
        compile_optimizer=False,
        peak_flops=peak_flops("cpu"),  # None unless NIGHTLAB_PEAK_FLOPS is set
        warmup_steps=2,
        _attention=_sdpa,
    )
