"""Tests of the GPT template `train.py`, run as the fleet runs it: a subprocess in a lab directory.

A tiny profile (demo data, vocab 512, 64-token rows) and a one-layer model keep each run to a
few seconds; `NIGHTLAB_MAX_STEPS` makes runs step-based, hence deterministic. Covers the summary
block (by hand, `hand_in` runs the harness's scorer in a second process), determinism per seed, the
time budget, and the failure modes: NaN loss, a non-causal model, unprepared data. The optimizer's numerics are checked in-process against an SVD.
Run: .venv/bin/python -m pytest -q tests/harness/test_train.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import resources

import pytest

from nightlab.harness.data import prepare
from nightlab.harness.profiles import Profile, fingerprint
from nightlab.search.knobs import set_knobs

PROFILE = Profile("test", "demo", vocab_size=512, seq_len=64, budget_seconds=2.0, eval_tokens=4096)
TINY = {"DEPTH": "1", "HEAD_DIM": "64", "DEVICE_BATCH_SIZE": "4", "TOTAL_BATCH_SIZE": "256"}
SUMMARY_KEYS = [
    "val_bpb", "training_seconds", "total_seconds", "peak_vram_mb", "mfu_percent", "total_tokens_M",
    "num_steps", "num_params_M", "depth", "tok_per_sec", "device", "peak_tflops", "attention", "compile",
    "startup_seconds", "eval_seconds", "warmup_seconds", "data_fingerprint",
]  # fmt: skip


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    prepare(PROFILE, data_dir=root / fingerprint(PROFILE), progress=False)
    return root


@pytest.fixture
def lab(tmp_path):
    toml = "\n".join(
        f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"'
        for k, v in PROFILE.to_dict().items()
        if k != "train_defaults"
    )
    (tmp_path / "nightlab.toml").write_text("[profile]\n" + toml + "\n")
    return tmp_path


def template(**knobs: str) -> str:
    source = resources.files("nightlab.targets.gpt").joinpath("train.py").read_text()
    return set_knobs(source, {**TINY, **knobs})


def run(lab, data_root, source, **env):
    (lab / "train.py").write_text(source)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("NIGHTLAB_")}
    full_env.update(
        {"NIGHTLAB_DATA_DIR": str(data_root), "OMP_NUM_THREADS": "1", "NIGHTLAB_MAX_STEPS": "4", **env}
    )
    return subprocess.run(
        [sys.executable, "train.py"], cwd=lab, env=full_env, capture_output=True, text=True, timeout=120
    )


def summary(stdout: str) -> dict[str, str]:
    block = stdout.split("\n---\n")[-1]
    return {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in block.splitlines())}


def test_summary_block_is_complete_and_runs_are_deterministic_per_seed(lab, data_root):
    first = run(lab, data_root, template())
    assert first.returncode == 0, first.stderr
    s = summary(first.stdout)
    assert list(s) == SUMMARY_KEYS
    assert s["num_steps"] == "4" and s["depth"] == "1" and s["device"].startswith("cpu")
    assert s["data_fingerprint"] == fingerprint(PROFILE)
    assert s["mfu_percent"] == "n/a" and s["peak_tflops"] == "n/a"  # a CPU has no table entry
    assert float(s["peak_vram_mb"]) > 50  # peak RSS on CPU
    # A uniform guess costs log2(512) = 9 bits per token, over ~2-3 bytes per token; 4 steps learn.
    assert 0 < float(s["val_bpb"]) < 3.5

    again = summary(run(lab, data_root, template(), NIGHTLAB_SEED="0").stdout)
    other = summary(run(lab, data_root, template(), NIGHTLAB_SEED="1").stdout)
    assert again["val_bpb"] == s["val_bpb"]
    assert other["val_bpb"] != s["val_bpb"]


def test_time_budget_bounds_training(lab, data_root):
    result = run(lab, data_root, template(), NIGHTLAB_MAX_STEPS="0", NIGHTLAB_BUDGET="1.5")
    assert result.returncode == 0, result.stderr
    s = summary(result.stdout)
    assert 1.5 <= float(s["training_seconds"]) < 5.0  # stops at the first step past the budget
    assert int(s["num_steps"]) > 4


def test_nan_loss_stops_with_one_fail_line(lab, data_root):
    result = run(lab, data_root, template(MATRIX_LR="1e30"))
    assert result.returncode == 1
    fails = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1 and fails[0].startswith("FAIL: loss is nan at step ")
    assert "\n---\n" not in result.stdout


def test_exploding_loss_stops_with_one_fail_line(lab, data_root):
    """A finite loss far above ln(vocab) is a divergence too (the loss is scaled up in the source)."""
    source = template()
    assert "train_loss = loss.item()\n" in source
    result = run(
        lab, data_root, source.replace("train_loss = loss.item()\n", "train_loss = loss.item() * 1000\n")
    )
    assert result.returncode == 1
    fails = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1 and fails[0].startswith("FAIL: loss exploded to ") and " at step 0" in fails[0]
    assert "\n---\n" not in result.stdout


def test_a_nan_val_bpb_stops_with_one_fail_line(lab, data_root):
    call = "score = hand_in(model, batches).score"
    source = template()
    assert call in source
    nan_logits = "GPT.SOFTCAP = float('nan')\n    " + call  # trained fine, scores NaN
    result = run(lab, data_root, source.replace(call, nan_logits))
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    fails = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1 and fails[0].startswith("FAIL: val_bpb is nan after step 4"), fails
    assert "\n---\n" not in result.stdout


def test_non_causal_model_is_reported_invalid(lab, data_root):
    causal = "x = x0 = norm(self.wte(idx))"
    source = template()
    assert causal in source
    leaky = source.replace(causal, "x = x0 = norm(self.wte(idx) + self.wte(idx.roll(-1, dims=1)))")
    result = run(lab, data_root, leaky)
    assert result.returncode == 0, result.stderr
    s = summary(result.stdout)
    assert s["status"] == "invalid"
    assert s["invalid_reason"].startswith("model is not causal")
    assert "invalid: model is not causal" in result.stderr


def test_unprepared_data_exits_1_naming_prepare(lab, tmp_path):
    result = run(lab, tmp_path / "empty", template())
    assert result.returncode == 1
    assert "DataNotPreparedError" in result.stderr and "nightlab prepare" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def definitions():
    """The template's functions and classes: everything above its `# Setup` banner, run in-process."""
    source = resources.files("nightlab.targets.gpt").joinpath("train.py").read_text()
    namespace: dict = {}
    exec(compile(source.split("\n# Setup\n")[0], "train.py", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("shape", [(2, 96, 24), (1, 24, 96)])
def test_polar_express_approximates_the_polar_factor(definitions, shape):
    import torch

    G = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    X = definitions["orthogonalize"](G, torch.float32)
    U, _, Vh = torch.linalg.svd(G, full_matrices=False)
    singular = torch.linalg.svdvals(X)
    assert singular.min() > 0.8 and singular.max() < 1.2  # ~U V^T: all singular values near 1
    assert (X - U @ Vh).norm() / (U @ Vh).norm() < 0.15


def test_muon_update_keeps_the_orthogonalised_norm(definitions):
    import torch

    rows, cols = 48, 16
    g = torch.randn(1, rows, cols, generator=torch.Generator().manual_seed(1))
    params = torch.zeros(1, rows, cols)
    second = torch.zeros(1, rows, 1)
    lr, wd, momentum = torch.tensor(0.1), torch.tensor(0.5), torch.tensor(0.0)
    definitions["muon_update"](params, g, torch.zeros_like(g), second, lr, wd, momentum, 0.95, torch.float32)
    # The variance normalisation reshapes the update across rows but keeps its norm; LR grows with sqrt(rows/cols).
    expected = 0.1 * (rows / cols) ** 0.5 * definitions["orthogonalize"](g, torch.float32).norm()
    assert params.norm().item() == pytest.approx(expected.item(), rel=1e-4)
    assert second.min() > 0
