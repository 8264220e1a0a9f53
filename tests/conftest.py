"""Shared fixtures: labs built over the synthetic target (see labkit.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# This suite shares small CI machines with other jobs, so its ordinary runs are sampled but never
# judged starved (`fleet/health.py`: a threshold of 0 turns the CPU check off). With 0.05 a sleeping
# synthetic run that waited 0.5 s for a core at load 6 per core (4 % of what it asked for) ended
# `degraded` and failed an unrelated test. The health tests set their own threshold.
os.environ.setdefault("NIGHTLAB_MIN_CPU_SHARE", "0")

from labkit import SYNTHETIC_TRAIN, commit, nightlab

# Nothing skipped silently (needs.py), a stopped run leaves nothing behind (services.py), and the
# files are shared out to xdist workers with the real-services folder kept whole (scheduling.py).
from needs import pytest_collection_modifyitems as _needs_collection
from needs import pytest_configure as _needs_configure
from needs import pytest_runtest_setup  # noqa: F401
from scheduling import pytest_collection_modifyitems as _slow_first
from scheduling import pytest_xdist_make_scheduler  # noqa: F401
from services import pytest_configure as _services_configure
from services import watchdog  # noqa: F401


def pytest_configure(config: pytest.Config) -> None:
    _needs_configure(config)
    _services_configure(config)


@pytest.hookimpl(trylast=True)  # after `-k` / `-m` deselected what will not run anyway
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items) -> None:
    _slow_first(config, items)
    _needs_collection(session, config, items)


@pytest.fixture
def target_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "target"
    repo.mkdir()
    (repo / "train.py").write_text(SYNTHETIC_TRAIN)
    (repo / "prepare.py").write_text("# fixed data preparation (unused by the synthetic target)\n")
    return repo


@pytest.fixture
def make_lab(tmp_path: Path, target_repo: Path):
    """Factory: a lab over the synthetic target with `slots` CPU slots and optional toml edits."""

    def make(
        slots: int = 2,
        *,
        name: str = "lab",
        timeout: float | None = None,
        extra_pools: str = "",
        idle_shutdown: float = 60,
        retries: int | None = None,
    ) -> Path:
        lab = tmp_path / name
        args = ["init", str(lab), "--target", str(target_repo), "--cpu-slots", str(slots)]
        if timeout is not None:
            args += ["--timeout", str(timeout)]
        crowded = slots > len(os.sched_getaffinity(0))
        if crowded:  # the synthetic target sleeps: more slots than cores cost nothing here
            args.append("--oversubscribe")
        nightlab(*args, cwd=tmp_path)
        toml = lab / "nightlab.toml"
        text = toml.read_text().replace("idle_shutdown = 900", f"idle_shutdown = {idle_shutdown}")
        if retries is not None:
            text = text.replace("retries = 2", f"retries = {retries}")
        text = text.replace("[search]", extra_pools + "\n[search]") if extra_pools else text
        if extra_pools and not crowded:  # the extra pools' local slots sleep too
            text = text.replace("[fleet]\n", "[fleet]\noversubscribe = true\n")
        toml.write_text(text)
        commit(lab, "test config")
        created.append(lab)
        return lab

    created: list[Path] = []
    yield make
    for lab in created:
        nightlab("fleet", "stop", cwd=lab, check=False)
