"""Tests for nightlab.harness.accel: the peak-FLOPs table, CPU detection, SDPA attention, compile fallback.

GPU paths (FA3 probe, bf16 autocast) need a CUDA machine; bench/gpu_check.sh exercises them there.
Run: .venv/bin/python -m pytest -q tests/harness/test_accel.py
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from nightlab.errors import UsageError
from nightlab.harness.accel import detect, peak_flops


@pytest.fixture(autouse=True)
def no_override(monkeypatch):
    monkeypatch.delenv("NIGHTLAB_PEAK_FLOPS", raising=False)


@pytest.mark.parametrize(
    ("name", "flops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.5e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA GH200 480GB", 989e12),
        ("NVIDIA B200", 2.25e15),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA A10G", 70e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA L40S", 362e12),
        ("NVIDIA GeForce RTX 4090", 165.2e12),
        ("NVIDIA GeForce RTX 5090", 209.5e12),
        ("NVIDIA GeForce RTX 3090", 71e12),
        ("AMD Instinct MI300X", 1307.4e12),
    ],
)
def test_peak_flops_table(name, flops):
    assert peak_flops(name) == flops


def test_l40s_is_not_l4_and_l4_is_not_l40s():
    assert peak_flops("NVIDIA L40S") == 362e12
    assert peak_flops("NVIDIA L4") == 121e12
    assert peak_flops("NVIDIA L40S") != peak_flops("NVIDIA L4")


@pytest.mark.parametrize(
    "name", ["NVIDIA GeForce RTX 3060", "Tesla V100-SXM2-16GB", "cpu", "", "NVIDIA H1000"]
)
def test_unknown_device_has_no_peak(name):
    assert peak_flops(name) is None


def test_env_override(monkeypatch):
    monkeypatch.setenv("NIGHTLAB_PEAK_FLOPS", "1.5e12")
    assert peak_flops("NVIDIA H100 80GB HBM3") == 1.5e12
    assert peak_flops("some unknown card") == 1.5e12


@pytest.mark.parametrize("value", ["fast", "0", "-3e12"])
def test_bad_env_override_names_the_value(monkeypatch, value):
    monkeypatch.setenv("NIGHTLAB_PEAK_FLOPS", value)
    with pytest.raises(UsageError, match=f"`{value}`"):
        peak_flops("NVIDIA L4")


@pytest.mark.skipif(torch.cuda.is_available() or torch.backends.mps.is_available(), reason="CPU-only check")
def test_detect_on_cpu_is_fp32_sdpa_eager(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    before = torch.get_num_threads()
    try:
        accel = detect()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert (accel.device, accel.dtype, accel.attention_backend) == ("cpu", torch.float32, "sdpa")
    assert not accel.compile_model and not accel.compile_optimizer
    assert accel.peak_flops is None and not accel.windows_supported
    assert accel.peak_memory_mb() > 10  # peak RSS of this process
    with accel.autocast():
        assert not torch.is_autocast_enabled("cpu")
    with pytest.warns(UserWarning, match="fa3"):
        assert detect(attention="fa3").attention_backend == "sdpa"


@pytest.mark.parametrize(
    ("kwargs", "value"), [({"attention": "flash"}, "flash"), ({"compile": "yes"}, "yes")]
)
def test_detect_rejects_unknown_choices(kwargs, value):
    with pytest.raises(UsageError, match=f"`{value}`"):
        detect(**kwargs)


def test_attention_is_causal_and_matches_reference():
    accel = detect(attention="sdpa", compile="off")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 16, 3, 8, generator=g) for _ in range(3))  # (B, T, H, D)
    out = accel.attention(q, k, v, window=4)  # SDPA ignores the window: full causal attention
    scores = torch.einsum("bthd,bshd->bhts", q, k) / 8**0.5
    scores = scores.masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), float("-inf"))
    expected = torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_model_compile_failure_falls_back_to_eager():
    accel = detect(compile="off")
    forced = dataclasses.replace(accel, compile_model=True)
    model = torch.nn.Linear(2, 2)

    def probe(m):
        raise RuntimeError("inductor exploded")

    with pytest.warns(UserWarning, match="inductor exploded"):
        module, compiled = forced.maybe_compile_model(model, probe)
    assert module is model and not compiled
    assert accel.maybe_compile_model(model, probe) == (model, False)  # compile off: the probe is not run


@pytest.mark.gpu  # skipped without a CUDA GPU, said before the first test (tests/needs.py)
def test_cuda_detection_and_attention_backends_agree():
    accel = detect()
    major, _ = torch.cuda.get_device_capability()
    assert accel.device == "cuda" and accel.compile_optimizer
    assert accel.dtype == (torch.bfloat16 if major >= 8 or torch.version.hip else torch.float32)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 512, 4, 128, device="cuda", generator=g) for _ in range(3))
    expected = detect(attention="sdpa").attention(q.float(), k.float(), v.float(), -1).float()
    for backend in ("sdpa", "fa3") if accel.attention_backend == "fa3" else ("sdpa",):
        out = detect(attention=backend).attention(q, k, v, -1)
        assert out.dtype == accel.dtype
        torch.testing.assert_close(out.float(), expected, atol=3e-2, rtol=3e-2)


@pytest.mark.gpu  # skipped without a CUDA GPU, said before the first test (tests/needs.py)
def test_cuda_model_compile_and_peak_memory():
    accel = detect(compile="on")
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).cuda()
    x = torch.randn(8, 64, device="cuda")

    def probe(m):
        with accel.autocast():
            m(x).float().sum().backward()

    module, compiled = accel.maybe_compile_model(model, probe)
    assert compiled and module is not model
    assert accel.peak_memory_mb() > 0


def test_optimizer_compile_failure_falls_back_to_eager():
    forced = dataclasses.replace(detect(compile="off"), compile_optimizer=True)

    def data_dependent(x):  # a Python branch on a tensor value cannot be one graph
        return x * 2 if x.sum().item() > 0 else x

    step = forced.compile_fn(data_dependent)
    with pytest.warns(UserWarning, match="data_dependent"):
        assert step(torch.ones(3)).tolist() == [2.0, 2.0, 2.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # eager from now on: no second attempt, no second warning
        assert step(-torch.ones(2)).tolist() == [-1.0, -1.0]
