"""The agent instructions `nightlab init` writes into every lab.

Two files, rendered from `templates/` with the lab's own facts (editable files, metric,
tiers, time limit) so an agent reads concrete commands, not placeholders:

- the fleet program: `program.md`, or `program.nightlab.md` when the target already has a
  `program.md`. The target's text is kept as it is: an autoresearch repository's
  `program.md` describes the research problem, and overwriting it would lose that. The two
  disagree on how to run experiments (autoresearch runs `train.py` by hand and commits every
  try), so nightlab's file says it takes precedence there, and the agent prompt puts it first.
- the skill: `SKILL.md` under `.claude/skills/nightlab/` (Claude Code's project skills) and
  `.agents/skills/nightlab/` (Codex and the open agent-skills layout), the same text twice
  because each tool looks only in its own place.

Usage:
    write_agent_files(staging_dir, parse_config(doc))
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from nightlab.config import LabConfig

PROGRAM = "program.md"
NIGHTLAB_PROGRAM = "program.nightlab.md"
SKILL_DIRS = (".claude/skills/nightlab", ".agents/skills/nightlab")

_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


def render(template: str, values: dict[str, str]) -> str:
    """Replace every `{{name}}` in `template`; a name without a value is a bug, so it raises KeyError."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def _template(name: str) -> str:
    return resources.files("nightlab.agent").joinpath("templates", name).read_text(encoding="utf-8")


def program_files(lab_dir: Path) -> tuple[Path | None, Path | None]:
    """(nightlab's fleet program, the target's own program.md) as they exist in the lab."""
    own = lab_dir / NIGHTLAB_PROGRAM
    program = lab_dir / PROGRAM
    if own.is_file():
        return own, program if program.is_file() else None
    return (program if program.is_file() else None), None


def _values(config: LabConfig, program_name: str, target_has_program: bool) -> dict[str, str]:
    editable = config.target.editable
    notes = ""
    if target_has_program:
        notes = (
            f"\n\nThe target's own notes are in `{PROGRAM}`: read them for the research problem. Where they"
            " say how to run or record experiments (running the script by hand, committing every try,"
            " writing results.tsv), this file takes precedence: nightlab does all of that for you."
        )
    return {
        "goal": "lower" if config.metric.lower_is_better else "raise",
        "metric": config.metric.name,
        "direction": config.metric.direction,
        "editable": ", ".join(f"`{name}`" for name in editable),
        "editable_files": " ".join(editable),
        "command": config.target.command,
        "timeout": f"{config.target.timeout:g}",
        "tiers": ", ".join(f"`{t}`" for t in config.fleet.tiers),
        "default_tier": config.fleet.default_tier,
        "target_notes": notes,
        "program": program_name,
    }


def write_agent_files(lab_dir: Path, config: LabConfig) -> list[Path]:
    """Write the fleet program and the skill file into a lab being created.

    Args:
        lab_dir: the lab's directory, with the target's files already in place.
        config: the lab's parsed configuration.

    Returns:
        The files written, program first.
    """
    target_has_program = (lab_dir / PROGRAM).is_file()
    program_name = NIGHTLAB_PROGRAM if target_has_program else PROGRAM
    values = _values(config, program_name, target_has_program)
    program = lab_dir / program_name
    program.write_text(render(_template("program.md"), values), encoding="utf-8")
    written = [program]
    skill = render(_template("SKILL.md"), values)
    for folder in SKILL_DIRS:
        path = lab_dir / folder / "SKILL.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(skill, encoding="utf-8")
        written.append(path)
    return written
