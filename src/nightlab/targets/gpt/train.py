"""Pretrain a small GPT for a fixed wall-clock budget; the harness scores it in val_bpb.

This is the file a lab's agents edit. Everything in it is fair game: the model, the optimizer,
the hyperparameters, the loop. What is fixed lives in the installed `nightlab.harness`: the data,
the tokenizer, the time budget and sequence length (the lab's profile in nightlab.toml), and the
metric (bits per byte on held-out text; lower is better). The harness owns the measurement: its
training-batch iterator stops at the budget, and the run ends by handing the trained model to the
harness (`hand_in`), which scores it in a separate process that never runs this file, on validation
data this process cannot read (docs/integrity.md).

Sections: hyperparameters -> model -> optimizer -> setup -> training loop -> evaluation and summary.
The model and optimizer follow karpathy/autoresearch: RoPE, QK norm, ReLU^2 MLP, value embeddings
with input-dependent gates, per-layer residual and x0 scalars, soft-capped logits; Muon (polar
express + variance normalisation + cautious weight decay) for matrices, AdamW for the rest, and an
LR schedule over the time budget. Device details (precision, attention kernel, compile) come from
`nightlab.harness.accel`.

Run inside a lab: `python train.py` (`nightlab submit` does it for you; by hand, `hand_in` starts the
harness's scorer itself). Environment: NIGHTLAB_SEED (default 0) seeds init and data order;
NIGHTLAB_BUDGET / NIGHTLAB_MAX_STEPS / NIGHTLAB_SKIP_EVAL shorten runs for tests and `nightlab tune`,
and the fleet never sets them.
"""

import time

t_start = time.time()  # start-up is measured from here: importing torch alone takes seconds

import math
import os
import sys
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from nightlab.errors import NightlabError
from nightlab.harness.accel import detect
from nightlab.harness.clock import training_batches
from nightlab.harness.data import load_manifest
from nightlab.harness.handoff import hand_in
from nightlab.harness.profiles import data_dir, load_lab_profile
from nightlab.harness.tokenizer import Tokenizer

# ---------------------------------------------------------------------------
# Hyperparameters (`nightlab submit --set NAME=VALUE` changes them for one experiment)

# Model size: DEPTH is the one dial; the width follows from it.
DEPTH = 8  # transformer blocks
ASPECT_RATIO = 64  # model_dim = DEPTH * ASPECT_RATIO, rounded up to a multiple of HEAD_DIM
HEAD_DIM = 128  # channels per attention head
WINDOW_PATTERN = "SSSL"  # per-layer attention window, tiled over layers: L = full, S = half context
# (the last layer is always L; windows need FA3, elsewhere every layer gets the full context)

# Batch: tokens per optimizer step, and rows per forward/backward (gradient accumulation fills the gap).
TOTAL_BATCH_SIZE = 2**19  # tokens; must be a multiple of DEVICE_BATCH_SIZE * seq_len
DEVICE_BATCH_SIZE = 128  # rows; lower it when memory runs out (`nightlab tune` measures this)

# Learning rates. AdamW ones are scaled by 1/sqrt(model_dim/768) (tuned at width 768).
EMBEDDING_LR = 0.6  # AdamW: token and value embeddings
UNEMBEDDING_LR = 0.004  # AdamW: lm_head
SCALAR_LR = 0.5  # AdamW: per-layer residual and x0 scalars
MATRIX_LR = 0.04  # Muon: every matrix inside the blocks
ADAM_BETAS = (0.8, 0.95)
WEIGHT_DECAY = 0.2  # Muon's cautious weight decay, fading to 0 with the schedule
MUON_MOMENTUM = 0.95  # Muon's Nesterov momentum ...
MUON_MOMENTUM_START = 0.85  # ... ramped up from this value ...
MUON_MOMENTUM_RAMP = 300  # ... over this many steps

# Schedule, as fractions of the time budget.
WARMUP_RATIO = 0.0  # LR ramps up from 0 over this fraction
WARMDOWN_RATIO = 0.5  # LR decays linearly over this final fraction ...
FINAL_LR_FRAC = 0.0  # ... down to this fraction of the peak

# Device paths (`nightlab tune` picks them by measuring): "auto" | "fa3" | "sdpa", "auto" | "on" | "off".
ATTENTION = "auto"
COMPILE = "auto"  # full-model torch.compile; falls back to eager on any compile error


# ---------------------------------------------------------------------------
# Model


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    seq_len: int
    n_layer: int
    n_head: int
    head_dim: int
    windows: tuple[int, ...]  # per layer: tokens visible to the left, -1 = full context

    @property
    def n_embd(self) -> int:
        return self.n_head * self.head_dim


def norm(x):
    return F.rms_norm(x, (x.size(-1),))  # no learnable weight: the scalars below do the scaling


def apply_rotary(x, cos, sin):
    # x: (B, T, H, D); cos, sin: (1, T, 1, D/2). Rotates channel pairs (i, i + D/2).
    d = x.size(-1) // 2
    x1, x2 = x[..., :d], x[..., d:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1)


def has_value_embedding(layer, n_layer):
    return layer % 2 == (n_layer - 1) % 2  # alternating layers, always including the last


class CausalSelfAttention(nn.Module):
    VE_GATE_CHANNELS = 32  # the gate of the value embedding reads the first channels of x

    def __init__(self, config, layer, attention):
        super().__init__()
        self.n_head, self.head_dim = config.n_head, config.head_dim
        self.window = config.windows[layer]
        self.attention = attention  # (B, T, H, D) x 3 -> (B, T, H, D), causal
        C = config.n_embd
        self.c_q = nn.Linear(C, C, bias=False)
        self.c_k = nn.Linear(C, C, bias=False)
        self.c_v = nn.Linear(C, C, bias=False)
        self.c_proj = nn.Linear(C, C, bias=False)
        gated = has_value_embedding(layer, config.n_layer)
        self.ve_gate = nn.Linear(self.VE_GATE_CHANNELS, self.n_head, bias=False) if gated else None

    def forward(self, x, ve, cos, sin):
        B, T, C = x.shape
        q = self.c_q(x).view(B, T, self.n_head, self.head_dim)
        k = self.c_k(x).view(B, T, self.n_head, self.head_dim)
        v = self.c_v(x).view(B, T, self.n_head, self.head_dim)
        if ve is not None:  # mix the token's value embedding into V, through a per-head gate in (0, 2)
            gate = 2 * torch.sigmoid(self.ve_gate(x[..., : self.VE_GATE_CHANNELS]))  # (B, T, H)
            v = v + gate.unsqueeze(-1) * ve.view(B, T, self.n_head, self.head_dim).to(v.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        q, k = norm(q), norm(k)  # QK norm keeps attention logits bounded
        y = self.attention(q, k, v, self.window)
        return self.c_proj(y.reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)).square())  # ReLU^2


class Block(nn.Module):
    def __init__(self, config, layer, attention):
        super().__init__()
        self.attn = CausalSelfAttention(config, layer, attention)
        self.mlp = MLP(config)

    def forward(self, x, ve, cos, sin):
        x = x + self.attn(norm(x), ve, cos, sin)
        return x + self.mlp(norm(x))


class GPT(nn.Module):
    SOFTCAP = 15.0  # logits = SOFTCAP * tanh(logits / SOFTCAP)
    ROPE_BASE = 10000.0

    def __init__(self, config, attention):
        super().__init__()
        self.config = config
        V, C, L = config.vocab_size, config.n_embd, config.n_layer
        self.wte = nn.Embedding(V, C)
        self.value_embeds = nn.ModuleDict(
            {str(i): nn.Embedding(V, C) for i in range(L) if has_value_embedding(i, L)}
        )
        self.blocks = nn.ModuleList([Block(config, i, attention) for i in range(L)])
        self.lm_head = nn.Linear(C, V, bias=False)  # untied from wte
        self.resid_lambdas = nn.Parameter(torch.empty(L))  # scales the residual stream entering each block
        self.x0_lambdas = nn.Parameter(torch.empty(L))  # mixes the first embedding back in
        self.register_buffer("cos", torch.empty(1, config.seq_len, 1, config.head_dim // 2), persistent=False)
        self.register_buffer("sin", torch.empty(1, config.seq_len, 1, config.head_dim // 2), persistent=False)

    @torch.no_grad()
    def init_weights(self):
        # All init lives here. The model is built on the meta device (no memory, no wasted init), so
        # every parameter and buffer must be set here after `to_empty`, or it holds garbage.
        C = self.config.n_embd
        bound = 3**0.5 * C**-0.5  # uniform with the std of N(0, 1/C)
        nn.init.normal_(self.wte.weight, std=1.0)
        nn.init.normal_(self.lm_head.weight, std=0.001)
        for ve in self.value_embeds.values():
            nn.init.uniform_(ve.weight, -bound, bound)
        for block in self.blocks:
            for linear in (block.attn.c_q, block.attn.c_k, block.attn.c_v, block.mlp.c_fc):
                nn.init.uniform_(linear.weight, -bound, bound)
            nn.init.zeros_(block.attn.c_proj.weight)  # each block starts as the identity
            nn.init.zeros_(block.mlp.c_proj.weight)
            if block.attn.ve_gate is not None:
                nn.init.zeros_(block.attn.ve_gate.weight)  # gate 2 * sigmoid(0) = 1
        self.resid_lambdas.fill_(1.0)
        self.x0_lambdas.fill_(0.1)
        D = self.config.head_dim
        inv_freq = 1.0 / self.ROPE_BASE ** (
            torch.arange(0, D, 2, dtype=torch.float32, device=self.cos.device) / D
        )
        angles = torch.outer(
            torch.arange(self.config.seq_len, dtype=torch.float32, device=self.cos.device), inv_freq
        )
        self.cos.copy_(angles.cos()[None, :, None, :])
        self.sin.copy_(angles.sin()[None, :, None, :])

    def forward(self, idx, targets=None):
        # idx: (B, T) token ids. Returns logits (B, T, V) or, given targets (B, T), the mean cross-entropy.
        T = idx.size(1)
        cos, sin = self.cos[:, :T], self.sin[:, :T]
        x = x0 = norm(self.wte(idx))
        for i, block in enumerate(self.blocks):
            x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
            ve = self.value_embeds[str(i)](idx) if str(i) in self.value_embeds else None
            x = block(x, ve, cos, sin)
        logits = self.lm_head(norm(x)).float()
        logits = self.SOFTCAP * torch.tanh(logits / self.SOFTCAP)
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))

    def flops_per_token(self):
        # Training FLOPs per token: 6 per matmul weight (forward + backward), plus attention scores and
        # values (12 * head_dim * heads * visible context per layer). Embedding lookups are not matmuls.
        c = self.config
        lookups = self.wte.weight.numel() + sum(ve.weight.numel() for ve in self.value_embeds.values())
        scalars = self.resid_lambdas.numel() + self.x0_lambdas.numel()
        matmul_params = sum(p.numel() for p in self.parameters()) - lookups - scalars
        context = sum(c.seq_len if w < 0 else min(w, c.seq_len) for w in c.windows)
        return 6 * matmul_params + 12 * c.n_head * c.head_dim * context


# ---------------------------------------------------------------------------
# Optimizer: Muon for the matrices in the blocks, AdamW for everything else

# Polar Express (Amsel et al., 2025): per-iteration odd polynomials a*X + b*X^3 + c*X^5 that drive
# every singular value of X towards 1 faster than Newton-Schulz's fixed coefficients.
POLAR_EXPRESS_COEFFS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)


def orthogonalize(G, dtype):
    # G: (N, rows, cols), a stack of same-shaped gradients. Returns ~U V^T of each, in dtype.
    X = G.to(dtype)
    tall = X.size(-2) > X.size(-1)
    if tall:  # iterate on the smaller Gram matrix
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) * 1.02 + 1e-6)  # spectral norm <= 1 (with margin)
    for a, b, c in POLAR_EXPRESS_COEFFS:
        A = X @ X.mT
        X = a * X + (b * A + c * (A @ A)) @ X
    return X.mT if tall else X


def muon_update(params, grads, momentum_buf, second_buf, lr, weight_decay, momentum, beta2, ortho_dtype):
    # params, grads, momentum_buf: (N, rows, cols); second_buf: per-row (or per-column) mean squares.
    # lr, weight_decay, momentum: 0-d tensors, so a compiled version does not recompile as they change.
    momentum_buf.lerp_(grads, 1 - momentum)
    update = grads.lerp(momentum_buf, momentum)  # Nesterov
    update = orthogonalize(update, ortho_dtype).float()
    # Variance normalisation (NorMuon): equalise the update's per-row scale with a running second
    # moment, then restore its overall norm, so only the distribution over rows changes.
    reduce_dim = -1 if second_buf.size(-1) == 1 else -2
    second_buf.lerp_(update.square().mean(dim=reduce_dim, keepdim=True), 1 - beta2)
    normalised = update * second_buf.clamp_min(1e-10).rsqrt()
    scale = update.norm(dim=(-2, -1), keepdim=True) / normalised.norm(dim=(-2, -1), keepdim=True).clamp_min(
        1e-10
    )
    update = normalised * scale
    lr = lr * max(1.0, params.size(-2) / params.size(-1)) ** 0.5
    # Cautious weight decay: only decay where the update already pulls the weight towards zero.
    decay_mask = (update * params) > 0
    params.sub_(lr * weight_decay * params * decay_mask + lr * update.to(params.dtype))


class Muon(torch.optim.Optimizer):
    """Momentum -> orthogonalised update (polar express) -> variance-normalised -> cautious weight decay.

    Parameters of the same shape are stepped together as one stack (one batched orthogonalisation).
    """

    def __init__(self, params, *, lr, weight_decay, momentum, beta2=0.95, ortho_dtype, compile_fn):
        by_shape = {}
        for p in params:
            by_shape.setdefault(tuple(p.shape), []).append(p)
        groups = [{"params": ps, "initial_lr": lr} for ps in by_shape.values()]
        super().__init__(groups, dict(lr=lr, weight_decay=weight_decay, momentum=momentum, beta2=beta2))
        self.ortho_dtype = ortho_dtype
        self.update = compile_fn(muon_update)
        self._scalars = {k: torch.tensor(0.0) for k in ("lr", "weight_decay", "momentum")}

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params = group["params"]
            stacked = torch.stack(params)
            grads = torch.stack([p.grad for p in params]).float()
            state = self.state[params[0]]
            if not state:
                rows, cols = stacked.shape[-2:]
                second_shape = (len(params), rows, 1) if rows >= cols else (len(params), 1, cols)
                state["momentum_buf"] = torch.zeros_like(grads)
                state["second_buf"] = torch.zeros(second_shape, device=grads.device)
            for k, t in self._scalars.items():
                t.fill_(group[k])
            s = self._scalars
            self.update(
                stacked, grads, state["momentum_buf"], state["second_buf"],
                s["lr"], s["weight_decay"], s["momentum"], group["beta2"], self.ortho_dtype,
            )  # fmt: skip
            torch._foreach_copy_(params, list(stacked.unbind(0)))


def build_optimizers(model, accel):
    """AdamW for embeddings, lm_head and scalars; Muon for the 2-D matrices in the blocks."""
    dim_scale = (model.config.n_embd / 768) ** -0.5  # AdamW LRs were tuned at width 768
    adam_groups = [
        (list(model.wte.parameters()) + list(model.value_embeds.parameters()), EMBEDDING_LR),
        (list(model.lm_head.parameters()), UNEMBEDDING_LR),
        ([model.resid_lambdas, model.x0_lambdas], SCALAR_LR),
    ]
    adamw = torch.optim.AdamW(
        [{"params": ps, "lr": lr * dim_scale, "initial_lr": lr * dim_scale} for ps, lr in adam_groups],
        betas=ADAM_BETAS,
        eps=1e-10,
        weight_decay=0.0,
        fused=accel.device == "cuda",
    )
    muon = Muon(
        list(model.blocks.parameters()),
        lr=MATRIX_LR,
        weight_decay=WEIGHT_DECAY,
        momentum=MUON_MOMENTUM_START,
        ortho_dtype=accel.dtype,
        compile_fn=accel.compile_fn,
    )
    return adamw, muon


def lr_multiplier(progress):
    # progress: fraction of the budget used, 0..1
    if progress < WARMUP_RATIO:
        return progress / WARMUP_RATIO
    if progress < 1 - WARMDOWN_RATIO:
        return 1.0
    cooldown = (1 - progress) / WARMDOWN_RATIO
    return cooldown + (1 - cooldown) * FINAL_LR_FRAC


# ---------------------------------------------------------------------------
# Setup

profile = load_lab_profile()
seed = int(os.environ.get("NIGHTLAB_SEED", "0"))
data = data_dir(profile)
try:
    manifest = load_manifest(data, profile=profile)
except NightlabError as e:  # e.g. DataNotPreparedError: one line that says to run `nightlab prepare`
    print(f"{type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(1)

torch.manual_seed(seed)
accel = detect(attention=ATTENTION, compile=COMPILE)
T = profile.seq_len
vocab_size = Tokenizer.load(data).vocab_size
n_head = -(-DEPTH * ASPECT_RATIO // HEAD_DIM)  # model_dim rounded up to a multiple of HEAD_DIM
pattern = [WINDOW_PATTERN[i % len(WINDOW_PATTERN)] for i in range(DEPTH)]
pattern[-1] = "L"
windows = tuple(-1 if c == "L" or not accel.windows_supported else T // 2 for c in pattern)
config = GPTConfig(vocab_size, T, DEPTH, n_head, HEAD_DIM, windows)

with torch.device("meta"):
    model = GPT(config, accel.attention)
model.to_empty(device=accel.device)
model.init_weights()
adamw, muon = build_optimizers(model, accel)
optimizers = (adamw, muon)

tokens_per_pass = DEVICE_BATCH_SIZE * T
if TOTAL_BATCH_SIZE % tokens_per_pass:
    raise ValueError(
        f"TOTAL_BATCH_SIZE {TOTAL_BATCH_SIZE} is not a multiple of DEVICE_BATCH_SIZE * seq_len = {tokens_per_pass}"
    )
grad_accum = TOTAL_BATCH_SIZE // tokens_per_pass
# The harness's clock serves the batches and stops at the budget (NIGHTLAB_BUDGET / NIGHTLAB_MAX_STEPS
# shorten it in tests); its first steps, up to a capped time, are an untimed warm-up (compile, allocator).
batches = training_batches(profile, DEVICE_BATCH_SIZE, accel.device, seed=seed)
x, y = next(batches)


def compile_probe(m):
    with accel.autocast():
        m(x, y).backward()


train_model, compiled = accel.maybe_compile_model(model, compile_probe)
model.zero_grad(set_to_none=True)
num_params = sum(p.numel() for p in model.parameters())
flops_per_token = model.flops_per_token()
print(
    f"device: {accel.device_name} | {accel.dtype} | attention {accel.attention_backend} | compile {compiled}"
)
print(f"model: depth {DEPTH}, dim {config.n_embd}, {n_head} heads of {HEAD_DIM}, windows {windows}")
print(f"params: {num_params / 1e6:.2f}M | {flops_per_token / 1e6:.1f} MFLOP/token | vocab {vocab_size}")
print(
    f"batch: {TOTAL_BATCH_SIZE} tokens/step = {grad_accum} x {DEVICE_BATCH_SIZE} rows x {T} | "
    f"budget {batches.budget:g}s"
)

# ---------------------------------------------------------------------------
# Training loop: runs until the harness's clock stops serving batches (the budget is spent).

step = 0
smooth_loss = 0.0
next_log = 0.0
pending = (x, y)  # the compile probe's batch trains first
while True:
    accel.synchronize()
    t0 = time.time()
    for _ in range(grad_accum):
        batch, pending = pending or next(batches, None), None
        if batch is None:  # the budget is spent: a partial step is dropped
            break
        x, y = batch
        with accel.autocast():
            loss = train_model(x, y)
        (loss / grad_accum).backward()
    else:
        progress = batches.progress
        lrm = lr_multiplier(progress)
        ramp = min(step / MUON_MOMENTUM_RAMP, 1.0)
        for opt in optimizers:
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] * lrm
        for group in muon.param_groups:
            group["momentum"] = (1 - ramp) * MUON_MOMENTUM_START + ramp * MUON_MOMENTUM
            group["weight_decay"] = WEIGHT_DECAY * (1 - progress)
        for opt in optimizers:
            opt.step()
        batches.step()
        train_loss = loss.item()
        if not math.isfinite(train_loss) or train_loss > 100:  # ln(vocab) is ~9: 100 means diverged
            what = f"exploded to {train_loss:.1f}" if math.isfinite(train_loss) else f"is {train_loss}"
            print(f"FAIL: loss {what} at step {step}")
            sys.exit(1)
        step += 1
        dt = time.time() - t0
        smooth_loss = 0.9 * smooth_loss + 0.1 * train_loss
        if progress >= next_log or step == 1:
            next_log = progress + 0.05
            tok_s = TOTAL_BATCH_SIZE / dt
            mfu = f"{100 * flops_per_token * tok_s / accel.peak_flops:.1f}%" if accel.peak_flops else "n/a"
            print(
                f"step {step:05d} ({100 * progress:.0f}%) | loss {smooth_loss / (1 - 0.9**step):.4f} | "
                f"lrm {lrm:.2f} | {dt * 1000:.0f} ms | {tok_s:,.0f} tok/s | mfu {mfu}",
                flush=True,
            )
        model.zero_grad(set_to_none=True)
        continue
    break

# ---------------------------------------------------------------------------
# Hand the model to the harness (it measures val_bpb apart from this file) and print the summary.
# Inside the fleet the harness-owned keys (val_bpb, training_seconds, data_fingerprint, status) come
# from the harness's scorer; by hand, `hand_in` runs that scorer and returns its result.

clock = batches.figures()
score = None
if os.environ.get("NIGHTLAB_SKIP_EVAL") != "1":
    score = hand_in(model, batches).score
    if score and score.get("val_bpb") is not None and not math.isfinite(score["val_bpb"]):
        print(f"FAIL: val_bpb is {score['val_bpb']} after step {step}")
        sys.exit(1)

total_seconds = time.time() - t_start
train_time = clock.training_seconds
timed_tokens = (clock.steps - clock.warmup_steps) * TOTAL_BATCH_SIZE
eval_seconds = score["eval_seconds"] if score else 0.0
tok_per_sec = timed_tokens / train_time if train_time > 0 else 0.0
summary = {}
if score and score.get("val_bpb") is not None:
    summary["val_bpb"] = f"{score['val_bpb']:.6f}"
summary.update(
    training_seconds=f"{train_time:.1f}",
    total_seconds=f"{total_seconds:.1f}",
    peak_vram_mb=f"{accel.peak_memory_mb():.1f}",  # device memory on GPUs, peak RSS on CPU
    mfu_percent=f"{100 * flops_per_token * tok_per_sec / accel.peak_flops:.2f}"
    if accel.peak_flops
    else "n/a",
    total_tokens_M=f"{step * TOTAL_BATCH_SIZE / 1e6:.1f}",
    num_steps=step,
    num_params_M=f"{num_params / 1e6:.1f}",
    depth=DEPTH,
    tok_per_sec=f"{tok_per_sec:.0f}",
    device=accel.device_name,
    peak_tflops=f"{accel.peak_flops / 1e12:.1f}" if accel.peak_flops else "n/a",
    attention=accel.attention_backend,
    compile="on" if compiled else "off",
    startup_seconds=f"{total_seconds - train_time - clock.warmup_seconds - eval_seconds:.1f}",
    eval_seconds=f"{eval_seconds:.1f}",
    warmup_seconds=f"{clock.warmup_seconds:.1f}",
    data_fingerprint=manifest["fingerprint"],
)
if score and score.get("invalid_reason"):  # e.g. not causal: the fleet records the run as `invalid`
    print(f"invalid: {score['invalid_reason']}", file=sys.stderr)
    summary.update(status="invalid", invalid_reason=score["invalid_reason"])
print("---")
for key, value in summary.items():
    print(f"{key + ':':<18}{value}")
