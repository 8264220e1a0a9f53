"""Labs over the synthetic target with `[trackers]` configured (the real libraries, offline)."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit import commit


@pytest.fixture
def tracked_lab(make_lab):
    """Factory: a lab whose nightlab.toml has the given `[trackers]` text appended and committed."""

    def make(trackers: str, **kwargs) -> Path:
        lab = make_lab(**kwargs)
        toml = lab / "nightlab.toml"
        toml.write_text(toml.read_text() + "\n" + trackers)
        commit(lab, "trackers")
        return lab

    return make
