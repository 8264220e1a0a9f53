"""Tests for bench/gpu_check.py and bench/gpu_check.sh: the GPU check made to run at the first try.

Unit tests cover the package arithmetic (what the kit carries), the summary parsing and the goals,
the time boxes (a step past its box is killed with its children) and the env step's missing-module
error. One end-to-end test runs `bench/gpu_check.sh --rehearse` on this CPU with the dev venv, so
the script cannot rot between GPU loans; `make gpu-rehearse` is the stricter rehearsal (venvs with
only the GPU image's packages). Run: .venv/bin/python -m pytest -q tests/bench/test_gpu_check.py
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gpu_check", REPO / "bench" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


def test_kit_carries_exactly_what_the_image_lacks_pinned_as_pyproject_pins_it():
    image = gpu_check.read_image_list()
    assert image["torch"] == "2.11.0" and image["numpy"] == "2.5.2" and "rustbpe" not in image
    assert gpu_check.kit_specs() == ["rustbpe>=0.1,<0.2"]
    # If the image lost numpy, the kit would carry it, at pyproject's pin.
    del image["numpy"]
    assert gpu_check.kit_specs(image) == ["numpy>=1.26,<3", "rustbpe>=0.1,<0.2"]


def test_image_specs_use_the_image_versions_and_never_torch():
    specs = gpu_check.image_specs()
    assert "numpy==2.5.2" in specs and "tiktoken==0.14.0" in specs
    assert "rich>=13,<16" in specs  # version unknown on the image: pyproject's pin
    assert not any(s.startswith("torch") for s in specs)
    assert "numpy>=1.26,<3" in gpu_check.image_specs(loose=True)


def test_every_required_module_is_one_the_harness_or_its_tests_use():
    # Guards the list against typos: each name must be importable in the dev venv.
    for module in gpu_check.REQUIRED:
        assert importlib.util.find_spec(module) is not None, module


BLOCK = """step 00040 (97%) | loss 3.1 | 310 ms | 1,690,000 tok/s | mfu 47.0%
---
val_bpb:          1.234567
training_seconds: 30.1
peak_vram_mb:     41000.5
mfu_percent:      47.10
num_steps:        95
tok_per_sec:      1700000
device:           NVIDIA H200
peak_tflops:      989.0
attention:        sdpa
compile:          on
startup_seconds:  12.5
eval_seconds:     3.0
"""


def test_train_figures_and_goals_from_a_summary_block():
    block = gpu_check.parse_block(BLOCK)
    fig = gpu_check.train_figures(block, full_size=True, eval_tokens=2**16, peak_measured=790.0, goals=True)
    assert fig["tok_per_sec"] == 1700000 and fig["compile"] == "on" and fig["scoring_seconds"] == 3.0
    assert fig["mfu_vs_measured_matmul_percent"] == pytest.approx(47.10 * 989 / 790, abs=0.01)
    full = 3.0 + 40 * 2**19 / (3 * 1700000)  # 21M tokens at a third of a training step each
    assert fig["scoring_seconds_full_eval_estimate"] == pytest.approx(full, abs=0.05)
    assert fig["goal_mfu"].startswith("PASS (47.1 %")
    assert fig["goal_startup_scoring"] == f"PASS ({12.5 + round(full, 1):.1f} s vs <= 20 s)"
    # A scorer's own time wins over train.py's eval_seconds; no goals off the GPU.
    block["score_seconds"] = "9.0"
    fig = gpu_check.train_figures(block, full_size=False, eval_tokens=2**15, peak_measured=None, goals=False)
    assert (
        fig["scoring_seconds"] == 9.0
        and "goal_mfu" not in fig
        and "mfu_vs_measured_matmul_percent" not in fig
    )


# train.py's progress on the H200 (2026-12-04, budget 75 s, cold compile cache): the first step
# holds the optimizer's compile, and the compile ran ~28 s past the 18.75 s warm-up cap
PROGRESS = """\
   step 00001 (21%) | loss 6.9295 | lrm 1.00 | 12958 ms | 40,461 tok/s | mfu 1.0%
   step 00002 (38%) | loss 6.4220 | lrm 1.00 | 285 ms | 1,837,645 tok/s | mfu 47.3%
   step 00015 (43%) | loss 2.4310 | lrm 1.00 | 303 ms | 1,727,518 tok/s | mfu 44.5%
   step 00028 (48%) | loss 1.6102 | lrm 1.00 | 298 ms | 1,759,043 tok/s | mfu 45.3%
"""


def test_the_mfu_goal_is_judged_on_the_steady_steps_not_on_a_budget_diluted_by_compile():
    steady = gpu_check.steady_state(PROGRESS)
    assert steady == {
        "steady_step_ms": 298.0,
        "steady_tok_per_sec": 1759043.0,
        "steady_mfu_percent": 45.3,
        "progress_lines": 3,
    }
    block = gpu_check.parse_block(
        BLOCK.replace("tok_per_sec:      1700000", "tok_per_sec:      1096384")
        .replace("mfu_percent:      47.10", "mfu_percent:      28.25")
        .replace("training_seconds: 30.1", "training_seconds: 75.1")
        .replace("num_steps:        95", "num_steps:        157")
    )
    assert (block["training_seconds"], block["num_steps"]) == ("75.1", "157")
    fig = gpu_check.train_figures(
        block, full_size=True, eval_tokens=2**16, peak_measured=771.8, goals=True, steady=steady
    )
    assert fig["mfu_percent"] == 28.25  # the summary block's figure is kept, and shown
    assert fig["goal_mfu"].startswith("PASS (45.3 %")
    assert fig["compile_spill_seconds"] == pytest.approx(75.1 - 157 * 0.298, abs=0.05)
    assert fig["scoring_seconds_full_eval_estimate"] == gpu_check.full_eval_estimate(3.0, 1759043.0)
    # without progress lines (a CPU run, a crash) the block's figures decide, as before
    assert gpu_check.steady_state("no progress\n") == {}
    plain = gpu_check.train_figures(block, full_size=False, eval_tokens=2**16, peak_measured=None, goals=True)
    assert plain["goal_mfu"].startswith("MISS (28.2 %") and "compile_spill_seconds" not in plain


def test_parse_block_and_pytest_counts():
    assert gpu_check.parse_block("no block here\n") == {}
    assert gpu_check.parse_block("---\nval_bpb: 1.0\n")["val_bpb"] == "1.0"
    assert gpu_check.parse_pytest("..s\n2 passed, 1 skipped, 180 deselected in 3.2s\n") == (
        "2 passed, 1 skipped, 180 deselected"
    )
    assert gpu_check.parse_pytest("ERROR collecting tests/x.py\n") == "ERROR collecting tests/x.py"


def _check(tmp_path: Path, deadline: float = 60) -> gpu_check.Check:
    args = argparse.Namespace(deadline=deadline, rehearse=True)
    return gpu_check.Check(args, tmp_path)


def test_a_step_past_its_time_box_is_killed_with_its_children(tmp_path, monkeypatch):
    monkeypatch.setitem(gpu_check.STEP_LIMITS, "tests", 1.5)
    monkeypatch.setattr(gpu_check, "MIN_STEP_SECONDS", 1)
    check = _check(tmp_path)
    pidfile = tmp_path / "child.pid"
    # The step starts a grandchild that would outlive a plain kill of the step's own process.
    script = f"import subprocess, time; p = subprocess.Popen(['sleep', '60']); open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    start = time.monotonic()
    rc, _ = check.run("tests", [sys.executable, "-c", script])
    assert rc is None and time.monotonic() - start < 10
    assert check.steps["tests"]["status"] == "timeout after 2s"
    grandchild = int(pidfile.read_text())
    for _ in range(50):  # the kill is asynchronous: give the kernel a moment to reap it
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(grandchild, 9)
        pytest.fail("the step's grandchild survived its time box")
    check.log.close()


def test_a_step_with_no_time_left_is_not_started(tmp_path):
    check = _check(tmp_path, deadline=5)  # under MIN_STEP_SECONDS
    rc, _ = check.run("env", [sys.executable, "-c", "raise SystemExit(3)"])
    assert rc is None and check.steps["env"]["status"] == "not run: out of time"
    check.log.close()


def test_env_step_names_a_missing_module_and_the_fix(monkeypatch):
    monkeypatch.setitem(gpu_check.REQUIRED, "no_such_module_xyz", "no-such-module-xyz")
    result = gpu_check.step_env(argparse.Namespace(without=[]))
    assert result["status"].startswith("failed: missing no_such_module_xyz (ModuleNotFoundError")
    assert "bench/gpu_kit.sh" in result["status"] and result["modules"]["numpy"].endswith("(image)")


def test_bad_usage_is_one_line_and_exit_2():
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    for argv in (["--without", "numpy", "--rehearse"], ["--without", "torch"], ["--profile", "nope"]):
        proc = subprocess.run(
            [sys.executable, "bench/gpu_check.py", *argv], cwd=REPO, env=env, capture_output=True, text=True
        )
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("gpu_check: ")


@pytest.mark.parametrize("with_dpkg_deb", [True, False])
def test_the_carried_bubblewrap_deb_is_unpacked_when_the_machine_has_no_bwrap(tmp_path, with_dpkg_deb):
    """The lent image has no bwrap: gpu_check.sh unpacks the kit's .deb into a temp folder and puts
    it first on PATH (never into /), and says why not when it cannot."""
    import shutil

    pkg, wheels, tools = tmp_path / "pkg", tmp_path / "wheels", tmp_path / "bin"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "DEBIAN" / "control").write_text(
        "Package: bubblewrap\nVersion: 0.0-test\nArchitecture: amd64\nMaintainer: t <t@t>\nDescription: t\n"
    )
    (pkg / "usr" / "bin").mkdir(parents=True)
    (pkg / "usr" / "bin" / "bwrap").write_text("#!/bin/sh\necho carried\n")
    (pkg / "usr" / "bin" / "bwrap").chmod(0o755)
    wheels.mkdir()
    subprocess.run(["dpkg-deb", "-b", str(pkg), str(wheels / "bubblewrap_0.0-test_amd64.deb")], check=True)
    tools.mkdir()  # a PATH with what the script needs and no bwrap
    needed = ["bash", "dirname", "mktemp", "head", "basename", "ls", "tr", "tar", "env"]
    for name in needed + (["dpkg-deb"] if with_dpkg_deb else []):
        (tools / name).symlink_to(shutil.which(name))
    python = tmp_path / "python"  # stands in for the image's python3: prints what it was handed
    python.write_text(
        '#!/bin/bash\n[ "$1" = -c ] && exit 0\necho "kit=$GPU_CHECK_BWRAP"; echo "bwrap=$(bwrap)"\n'
    )
    python.chmod(0o755)
    env = {"PATH": str(tools), "PYTHON": str(python), "GPU_WHEELS": str(wheels), "HOME": str(tmp_path)}
    proc = subprocess.run(
        ["bash", "bench/gpu_check.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    if with_dpkg_deb:
        assert proc.stdout.splitlines() == ["kit=bubblewrap_0.0-test_amd64.deb unpacked", "bwrap=carried"]
    else:
        assert (
            proc.stdout.splitlines()[0]
            == "kit=bubblewrap_0.0-test_amd64.deb could not be unpacked (no dpkg-deb?)"
        )


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~1 min alone; several minutes on the 2-core box under other suites
def test_rehearsal_end_to_end_on_cpu(tmp_path):
    """The whole check, as on the device but on CPU: every step ok or 'skipped: no CUDA'."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), "GPU_WHEELS": str(tmp_path / "none")}
    proc = subprocess.run(
        ["bash", "bench/gpu_check.sh", "--rehearse", "--budget", "3", "--deadline", "800"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=850,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    summary = json.loads((out / "gpu_check.json").read_text())
    steps = {name: step["status"] for name, step in summary["steps"].items()}
    assert steps["env"] == "ok" and steps["data"] == "ok" and steps["train"] == "ok (CPU)"
    assert steps["gpu"] == "skipped: no CUDA" and steps["tests"].startswith("skipped: no CUDA (")
    assert summary["train"]["tok_per_sec"] > 0 and summary["train"]["scoring_seconds"] > 0
    assert summary["train"]["val_bpb"] > 0 and summary["modules"]["rustbpe"]
    assert "== summary" in proc.stdout and (out / "gpu_check.log").stat().st_size > 0
