"""Fixtures for the search commands through the real CLI and fleet: labs over the synthetic target
with short runs and a known noise (labkit.SYNTHETIC_TRAIN: val_bpb = 1 + 10 (log10 LR - log10 0.02)^2
+ NOISE * 1.7 sin(12.9898 (seed + 1)))."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit import commit
from nightlab.search.knobs import set_knobs


@pytest.fixture
def quick_lab(make_lab):
    """Factory: a lab whose incumbent sleeps `sleep` s and has seeded noise `noise`; with `gate`,
    every run waits for that file to exist first."""

    def make(
        slots: int = 2, *, sleep: float = 0.1, noise: float = 0.01, gate: str = "", toml: str = "", **kwargs
    ) -> Path:
        lab = make_lab(slots=slots, **kwargs)
        train = lab / "train.py"
        knobs = {"SLEEP": repr(sleep), "NOISE": repr(noise), "GATE": repr(gate)}
        train.write_text(set_knobs(train.read_text(), knobs))
        if toml:
            path = lab / "nightlab.toml"
            path.write_text(path.read_text() + toml)
        commit(lab)
        return lab

    return make


@pytest.fixture
def cli_inprocess(capsys):
    """Run a nightlab command in this process (the same click command and error mapping as the
    `nightlab` entry point) so heavy imports (statsmodels, matplotlib) are paid once per session.

    Returns (exit code, stdout, stderr).
    """
    from nightlab.cli import main

    def run(lab: Path, command: str, *args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            main([command, "--lab", str(lab), *args])
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        out = capsys.readouterr()
        return code, out.out, out.err

    return run
