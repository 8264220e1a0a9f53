"""Labs over the synthetic target with `[trackers]` configured (the real libraries, offline)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labkit import commit, nightlab, wait_until


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


def trackers_state(lab: Path) -> dict[str, dict]:
    """`nightlab status --json`'s trackers, by name."""
    state = json.loads(nightlab("status", "--json", cwd=lab).stdout)
    return {t["tracker"]: t for t in state["trackers"]}


def wait_sent(lab: Path, name: str, n: int, timeout: float = 180) -> dict:
    """Until tracker `name` has sent `n` runs and has none queued; returns its status."""
    return wait_until(
        lambda: (t := trackers_state(lab)[name])["sent"] >= n and t["queued"] == 0 and t,
        timeout=timeout,
        interval=0.5,
    )
