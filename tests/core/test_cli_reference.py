"""docs/cli.md is generated from the command tree and must be current."""

from __future__ import annotations

from pathlib import Path

from nightlab.cli.reference import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_cli_reference_is_current():
    assert DOC.read_text() == render(), "regenerate: python -m nightlab.cli.reference > docs/cli.md"


def test_every_command_is_documented():
    text = render()
    for name in ("init", "submit", "sweep", "search", "agent run", "fleet up", "dashboard", "demo"):
        assert f"`nightlab {name}`" in text
