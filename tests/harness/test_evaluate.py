"""Tests for nightlab.harness.evaluate: val_bpb against hand-computed references, the causality probe.

Toy models only (no data directory): the end-to-end path through `evaluate` is covered by
tests/harness/test_train.py.
Run: .venv/bin/python -m pytest -q tests/harness/test_evaluate.py
"""

from __future__ import annotations

import math

import pytest
import torch

from nightlab.errors import NightlabError
from nightlab.harness.evaluate import bits_per_byte, causality_probe

V = 16


class Uniform(torch.nn.Module):
    """Equal logits everywhere: every token costs ln(V) nats."""

    def forward(self, x):
        return torch.zeros(*x.shape, V)


class Causal(torch.nn.Module):
    """Logits from a running (causal) mean of embeddings: position t sees tokens 0..t only."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(V, 8)
        self.head = torch.nn.Linear(8, V)

    def forward(self, x):
        h = self.emb(x).cumsum(1) / torch.arange(1, x.size(1) + 1).view(1, -1, 1)
        return self.head(h)


class Leaky(Causal):
    """Position t also sees token t+1: the classic off-by-one leak."""

    def forward(self, x):
        return super().forward(x) + self.head(self.emb(x.roll(-1, dims=1)))


class LeaksAtTheEnd(Causal):
    """Only the last positions see the future (a leak the middle probe alone would miss)."""

    def forward(self, x):
        out = super().forward(x)
        out[:, -3:-1] += self.head(self.emb(x[:, -1:]))
        return out


class AcrossBatch(Causal):
    """Mixes in the batch mean of the full sequence: leaks the future of every row."""

    def forward(self, x):
        return super().forward(x) + self.head(self.emb(x).mean(dim=(0, 1), keepdim=True))


def batches(n_batches=3, B=2, T=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        seq = torch.randint(0, V, (B, T + 1), generator=g)
        out.append((seq[:, :-1], seq[:, 1:]))
    return out


def test_uniform_logits_give_log2_v_times_tokens_over_bytes():
    token_bytes = torch.tensor([0] + [1, 2, 3] * 5)  # token 0 is special (0 bytes)
    data = batches()
    targets = torch.cat([y.reshape(-1) for _, y in data])
    scored = targets[token_bytes[targets] > 0]
    expected = math.log2(V) * scored.numel() / token_bytes[targets].sum().item()
    bpb, tokens = bits_per_byte(Uniform(), data, token_bytes)
    assert bpb == pytest.approx(expected, rel=1e-6)  # fp32 cross-entropy
    assert tokens == targets.numel()


def test_bpb_matches_a_hand_computed_cross_entropy():
    model = Causal()
    token_bytes = torch.arange(V) % 4  # tokens 0, 4, 8, 12 are special
    data = batches()
    nats = total_bytes = 0.0
    for x, y in data:
        logp = model(x).log_softmax(-1)
        for b in range(y.size(0)):
            for t in range(y.size(1)):
                n = int(token_bytes[y[b, t]])
                if n:
                    nats -= logp[b, t, y[b, t]].item()
                    total_bytes += n
    bpb, _ = bits_per_byte(model, data, token_bytes)
    assert bpb == pytest.approx(nats / math.log(2) / total_bytes, rel=1e-5)


def test_padded_vocab_columns_are_ignored():
    class Padded(torch.nn.Module):
        def forward(self, x):
            out = torch.zeros(*x.shape, V + 48)
            out[..., V:] = 50.0  # huge logits on ids the tokenizer never produces
            return out

    token_bytes = torch.ones(V, dtype=torch.int64)
    assert bits_per_byte(Padded(), batches(), token_bytes)[0] == pytest.approx(math.log2(V))


def test_no_scored_bytes_is_an_error():
    with pytest.raises(NightlabError, match="nightlab prepare"):
        bits_per_byte(Uniform(), batches(), torch.zeros(V, dtype=torch.int64))


def test_causal_model_passes_the_probe():
    x, _ = batches(1, B=3, T=32)[0]
    assert causality_probe(Causal(), x, V) is None


@pytest.mark.parametrize("model", [Leaky(), LeaksAtTheEnd(), AcrossBatch()], ids=lambda m: type(m).__name__)
def test_leaky_models_fail_the_probe(model):
    x, _ = batches(1, B=3, T=32)[0]
    reason = causality_probe(model, x, V)
    assert reason is not None and reason.startswith("model is not causal")


@pytest.mark.parametrize(
    "model",
    [lambda x: torch.zeros(x.size(0), V), lambda x: torch.zeros(*x.shape, V - 1), lambda x: (x, x)],
    ids=["2d", "short-vocab", "tuple"],
)
def test_wrong_logit_shapes_are_invalid(model):
    x, _ = batches(1)[0]
    reason = causality_probe(model, x, V)
    assert reason is not None and "must return logits of shape" in reason


def test_non_finite_logits_are_left_to_the_metric():
    x, y = batches(1)[0]
    nan_model = lambda x: torch.full((*x.shape, V), float("nan"))  # noqa: E731
    assert causality_probe(nan_model, x, V) is None  # not a leak: the metric reports NaN
    assert math.isnan(bits_per_byte(nan_model, [(x, y)], torch.ones(V, dtype=torch.int64))[0])


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    from nightlab.harness.data import prepare
    from nightlab.harness.profiles import Profile

    profile = Profile("test", "demo", vocab_size=300, seq_len=32, budget_seconds=1.0, eval_tokens=1000)
    return profile, prepare(profile, data_dir=tmp_path_factory.mktemp("data"), progress=False)


def test_evaluate_scores_the_profiles_eval_tokens(prepared):
    from nightlab.harness.evaluate import evaluate
    from nightlab.harness.loader import val_batches
    from nightlab.harness.tokenizer import Tokenizer

    profile, data_dir = prepared
    vocab = Tokenizer.load(data_dir).vocab_size
    token_bytes = torch.as_tensor(Tokenizer.load(data_dir).token_bytes, dtype=torch.int64)
    targets = torch.cat([y.reshape(-1) for _, y in val_batches(data_dir, 7, 32, "cpu", 1000)])
    scored = (token_bytes[targets] > 0).sum().item()

    def uniform(x):
        return torch.zeros(*x.shape, vocab)

    result = evaluate(uniform, profile, batch_size=7, device="cpu", data_dir=data_dir)
    assert result.invalid_reason is None
    assert result.tokens == targets.numel() == 32 * 32  # ceil(1000 / 32) rows of 32, whatever the batch size
    assert result.val_bpb == pytest.approx(
        math.log2(vocab) * scored / token_bytes[targets].sum().item(), rel=1e-6
    )


def test_evaluate_reports_a_leak_with_its_score(prepared):
    from nightlab.harness.evaluate import evaluate

    profile, data_dir = prepared

    def peeks(x):  # bets on the next input token: nearly free predictions (uniform scores ~5.5)
        return torch.nn.functional.one_hot(x.roll(-1, dims=1), 300).float() * 10

    result = evaluate(peeks, profile, batch_size=8, device="cpu", data_dir=data_dir)
    assert result.invalid_reason.startswith("model is not causal")
    assert result.val_bpb is not None and result.val_bpb < 1.0
