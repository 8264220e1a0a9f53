"""Fixtures of the reliability suite: fast shell-target labs whose processes always end."""

from __future__ import annotations

from pathlib import Path

import pytest

from nightlab.testing.reliability import make_fast_lab, stop_lab


@pytest.fixture
def fast_lab(tmp_path: Path):
    """Factory: `fast_lab(slots=2, timeout=60, ...)` -> a lab over the shell target.

    Teardown ends every process of every lab it made, by pid, even when the test failed.
    """
    made: list[Path] = []

    def make(**kwargs) -> Path:
        lab = make_fast_lab(tmp_path, name=f"lab{len(made)}", **kwargs)
        made.append(lab)
        return lab

    yield make
    for lab in made:
        stop_lab(lab)
