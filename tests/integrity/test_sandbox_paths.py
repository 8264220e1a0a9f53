"""The sandbox's private /tmp must not hide the run's own interpreter or lab.

A CI clone (and any venv) may live under /tmp; the first fresh-clone run of the red-team suite
failed with `/tmp/.../.venv/bin/python: not found` inside the sandbox.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from redteam import needs_sandbox

from nightlab.harness import sandbox


def _plan(tmp_path: Path) -> sandbox.SandboxPlan:
    data = tmp_path / "data" / "cpu"
    data.mkdir(parents=True)
    (data / "val.tokens.bin").write_bytes(b"secret")
    lab = tmp_path / "lab"
    (lab / ".nightlab" / "ledger").mkdir(parents=True)
    (lab / ".nightlab" / "ledger" / "ledger.db").write_text("ledger")
    (lab / "train.py").write_text("print('hi')\n")
    return sandbox.SandboxPlan(
        data_dir=data, data_root=tmp_path / "data", lab_dir=lab, writable=(lab / ".nightlab" / "work",)
    )


@needs_sandbox
def test_a_python_and_a_lab_under_tmp_stay_visible_and_the_hidden_stays_hidden(tmp_path, monkeypatch):
    venv = tmp_path / "venv"  # pytest's tmp_path is under /tmp: stands for a venv in a CI clone there
    venv.mkdir()
    (venv / "marker").write_text("interpreter files\n")
    monkeypatch.setattr(sys, "prefix", str(venv))
    plan = _plan(tmp_path)
    script = (
        f"cat {venv / 'marker'}; cat {plan.lab_dir / 'train.py'}; "
        f"cat {plan.data_dir / 'val.tokens.bin'} | wc -c; ls {plan.lab_dir / '.nightlab'}"
    )
    argv, mode = sandbox.wrap(["/bin/sh", "-c", script], plan=plan)
    assert mode == "bwrap"
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines[:4] == ["interpreter", "files", "print('hi')", "0"]  # val file empty
    assert "ledger" not in out.stdout  # .nightlab/ is still a tmpfs with only the work folder
