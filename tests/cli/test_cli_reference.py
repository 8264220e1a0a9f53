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


def test_the_reference_does_not_depend_on_what_ran_before():
    """click caches each command's help option on first use; the reference must render the same after
    commands ran in this process (the suite runs some in-process) and show `-h` as a user sees it."""
    from nightlab.cli import main

    before = render()
    for argv in (["status", "--lab", "/nonexistent"], ["sweep", "--lab", "/nonexistent", "X=1,2", "-m", "x"]):
        try:
            main(argv)
        except SystemExit:
            pass
    assert render() == before
    assert "-h, --help" in before.split("## `nightlab sweep`")[1]
