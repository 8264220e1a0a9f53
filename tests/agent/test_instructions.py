"""`nightlab init` writes the fleet program and the skill file into every lab."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from labkit import nightlab
from nightlab.agent.instructions import NIGHTLAB_PROGRAM, SKILL_DIRS, program_files, render


def tracked(lab: Path) -> set[str]:
    out = subprocess.run(["git", "ls-files"], cwd=lab, capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_a_target_without_program_gets_nightlabs_program_md_and_the_skill(make_lab):
    lab = make_lab(slots=2)
    program = (lab / "program.md").read_text()
    assert program.startswith("# nightlab: how to do research in this lab")
    assert "Your job: lower the metric `val_bpb`" in program
    assert "editing `train.py`" in program and "git checkout HEAD -- train.py" in program
    assert "hard limit of 600 s" in program and "`cpu`" in program
    assert "{{" not in program and "}}" not in program
    assert "- `degraded`: the machine starved" in program and "names the re-run" in program
    for section in (
        "## Working in waves",
        "## With a single slot",
        "Simplicity criterion",
        "## Reading crashes",
    ):
        assert section in program
    assert not (lab / NIGHTLAB_PROGRAM).exists()
    for folder in SKILL_DIRS:
        skill = (lab / folder / "SKILL.md").read_text()
        assert skill.startswith("---\nname: nightlab\ndescription: ")
        assert "`program.md`" in skill and "{{" not in skill
        assert f"{folder}/SKILL.md" in tracked(lab)
    assert "program.md" in tracked(lab)
    assert program_files(lab) == (lab / "program.md", None)


def test_a_targets_own_program_md_is_kept_and_nightlabs_goes_beside_it(tmp_path: Path):
    target = tmp_path / "autoresearch"
    target.mkdir()
    (target / "train.py").write_text("LR = 0.1\nprint('---')\nprint('score: 1.0')\n")
    original = "# autoresearch\nRun `uv run train.py` and commit every try.\n"
    (target / "program.md").write_text(original)
    nightlab("init", "lab", "--target", str(target), "--metric", "score", "--higher-is-better", cwd=tmp_path)
    lab = tmp_path / "lab"
    assert (lab / "program.md").read_text() == original
    ours = (lab / NIGHTLAB_PROGRAM).read_text()
    assert "Your job: raise the metric `score`" in ours and "(higher is better)" in ours
    assert "this file takes precedence" in ours
    assert "`program.nightlab.md`" in (lab / SKILL_DIRS[0] / "SKILL.md").read_text()
    assert program_files(lab) == (lab / NIGHTLAB_PROGRAM, lab / "program.md")
    assert {NIGHTLAB_PROGRAM, "program.md"} <= tracked(lab)


def test_render_refuses_a_placeholder_without_a_value():
    assert render("a {{x}} b", {"x": "1"}) == "a 1 b"
    with pytest.raises(KeyError):
        render("{{missing}}", {})


def test_program_files_of_a_lab_without_any(tmp_path: Path):
    assert program_files(tmp_path) == (None, None)


def test_the_builtin_target_keeps_its_program_and_gets_nightlabs_beside_it(tmp_path: Path):
    from importlib import resources

    nightlab("init", "lab", "--profile", "cpu", cwd=tmp_path)
    lab = tmp_path / "lab"
    builtin = resources.files("nightlab.targets.gpt").joinpath("program.md").read_text()
    assert (lab / "program.md").read_text() == builtin
    assert "Your job: lower the metric `val_bpb`" in (lab / NIGHTLAB_PROGRAM).read_text()
    assert program_files(lab) == (lab / NIGHTLAB_PROGRAM, lab / "program.md")
