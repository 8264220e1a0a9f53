"""What the sandbox hides and what it must not: the run's own interpreter and lab stay visible.

A CI clone (and any venv) may live under /tmp; the first fresh-clone run of the red-team suite
failed with `/tmp/.../.venv/bin/python: not found` inside the sandbox. A `local:` corpus folder
may hold them too.
"""

from __future__ import annotations

import dataclasses
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


@needs_sandbox
def test_a_local_corpus_is_hidden_by_every_path_and_what_the_run_needs_inside_it_stays(tmp_path, monkeypatch):
    """`SandboxPlan.hidden` masks a `local:` folder where it really is, and its symlinked files too.

    The corpus folder lies inside the lab (bound back for the run), the run's Python inside the
    corpus folder, and a corpus file inside that Python's folder: each level is what it should be.
    """
    from nightlab.harness.sources import source_paths

    plan = _plan(tmp_path)
    corpus = plan.lab_dir / "corpus"
    (corpus / "venv").mkdir(parents=True)
    (corpus / "a.txt").write_text("corpus text\n")
    (corpus / "venv" / "marker").write_text("interpreter\n")
    (corpus / "venv" / "extra.txt").write_text("corpus text in the venv\n")
    (plan.lab_dir / "outside").mkdir()
    (plan.lab_dir / "outside" / "real.txt").write_text("corpus text elsewhere in the lab\n")
    (corpus / "linked.txt").symlink_to(plan.lab_dir / "outside" / "real.txt")
    (tmp_path / "alias").symlink_to(corpus)
    monkeypatch.setattr(sys, "prefix", str(corpus / "venv"))
    plan = dataclasses.replace(plan, hidden=source_paths(f"local:{tmp_path / 'alias'}"))
    paths = [
        corpus / "venv" / "marker",
        plan.lab_dir / "train.py",
        corpus / "a.txt",
        tmp_path / "alias" / "a.txt",
        corpus / "venv" / "extra.txt",
        plan.lab_dir / "outside" / "real.txt",
    ]
    script = "; ".join(f"cat {p} 2>/dev/null || echo -" for p in paths)
    argv, mode = sandbox.wrap(["/bin/sh", "-c", script], plan=plan)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["interpreter", "print('hi')", "-", "-", "-", "-"]
