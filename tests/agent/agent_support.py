"""Helpers for the agent tests: the stand-in agent and where it reports what it saw.

Not a conftest.py: tests/conftest.py is imported as `conftest` by the other test folders.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

STAND_IN = Path(__file__).with_name("stand_in_agent.py")


def stand_in(mode: str) -> str:
    """The command line of the stand-in agent in `mode` (see stand_in_agent.py)."""
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(STAND_IN))} {mode}"


def seen_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The folder where the stand-in writes the prompts and results it saw.

    A test module makes it its fixture with `seen = pytest.fixture(seen_dir)`.
    """
    out = tmp_path / "seen"
    monkeypatch.setenv("STAND_IN_OUT", str(out))
    return out
