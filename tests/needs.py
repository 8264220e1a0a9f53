"""What tests need from the machine, in one place: nothing is skipped silently (issue 31).

Each `Need` names a piece of the machine (bubblewrap, chromium, the local Slurm stack, npm, a
CUDA GPU), the one check that says whether it is here (the same function the code under test
uses, where there is one), which tests need it (a marker or a fixture), and what to install.

As a pytest plugin (tests/conftest.py imports its hooks; `pytest -p needs` in any run):
- after collection, before the first test, one line per missing piece: how many tests it costs
  and the fix (`bubblewrap missing: the 4 sandbox and red-team tests will not run: ...`);
- at set-up, a test whose need is missing is skipped with that reason, or, under CI (`CI` set),
  fails, except for the pieces CI machines cannot have (a GPU).
`.ci/install-test-deps` installs what it can before the run (`make test` calls it).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Need:
    """One piece of the machine some tests need.

    Attributes:
        name: what is missing, as the line starts ("bubblewrap").
        tests: what the tests that need it are, in words ("sandbox red-team tests").
        check: None when the piece is here, else why not, naming the fix (one line).
        marker: tests with this marker need it.
        fixtures: tests using one of these fixtures need it.
        in_ci: whether a CI machine must have it (a missing one fails the tests there).
    """

    name: str
    tests: str
    check: Callable[[], str | None]
    marker: str | None = None
    fixtures: tuple[str, ...] = ()
    in_ci: bool = True


def bubblewrap() -> str | None:
    from nightlab.harness.sandbox import available

    return available()


def chromium() -> str | None:
    if chromium_path() is None:
        return "chromium not found: `apt-get install chromium` (never `playwright install`)"
    return None


def chromium_path() -> str | None:
    """Debian's Chromium, which the browser test drives through Playwright."""
    return shutil.which("chromium")


def local_slurm() -> str | None:
    sys.path.insert(0, str(Path(__file__).parent / "skypilot_real"))
    from localsky import missing

    lacking = missing()
    return None if lacking is None else f"the local Slurm + SkyPilot cluster needs {lacking}"


def agent_clis() -> str | None:
    sys.path.insert(0, str(Path(__file__).parent / "agent_real"))
    from real_support import CLIS, cli_installed

    if shutil.which("npm") or all(cli_installed(name) for name in CLIS):
        return None
    return "npm not found: `apt-get install nodejs npm` (the tests install the pinned CLIs with it)"


def cuda() -> str | None:
    import torch

    return None if torch.cuda.is_available() else "no CUDA GPU here: bench/gpu_check.sh runs them on one"


NEEDS = (
    Need("bubblewrap", "sandbox and red-team tests", bubblewrap, marker="sandbox"),
    Need("chromium", "real-browser dashboard tests", chromium, fixtures=("browser_page",)),
    Need("Slurm/munge/sshd (as root)", "real SkyPilot-on-Slurm tests", local_slurm, fixtures=("local_sky",)),
    Need("npm", "real agent CLI tests", agent_clis, fixtures=("bins",)),
    Need("CUDA GPU", "GPU tests", cuda, marker="gpu", in_ci=False),
)

MARKERS = {
    "sandbox": "needs bubblewrap: the run is sandboxed (tests/needs.py)",
    "gpu": "needs a CUDA GPU (tests/needs.py)",
}
_missing: dict[str, str | None] = {}  # need name -> why missing (None: here), checked once per run
_KEY = pytest.StashKey[list[Need]]()


def why_missing(need: Need) -> str | None:
    """The need's check, run once per test run."""
    if need.name not in _missing:
        _missing[need.name] = need.check()
    return _missing[need.name]


def needs_of(item: pytest.Item) -> list[Need]:
    """The pieces of the machine this test needs."""
    fixtures = set(getattr(item, "fixturenames", ()))
    return [
        n
        for n in NEEDS
        if (n.marker and item.get_closest_marker(n.marker)) or fixtures.intersection(n.fixtures)
    ]


def report_lines(items: list[pytest.Item]) -> list[str]:
    """One line per missing piece that collected tests need: what it costs and the fix."""
    lines = []
    for need in NEEDS:
        count = sum(1 for item in items if need in item.stash.get(_KEY, []))
        why = why_missing(need) if count else None
        if why is not None:
            ci = " (CI is set: they fail)" if os.environ.get("CI") and need.in_ci else ""
            tests = need.tests[:-1] if count == 1 else need.tests
            lines.append(f"{need.name} missing: the {count} {tests} will not run{ci}: {why}")
    return lines


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


@pytest.hookimpl(trylast=True)  # after `-k` / `-m` deselected what will not run anyway
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items) -> None:
    for item in items:
        item.stash[_KEY] = needs_of(item)
    # under pytest-xdist (`make test`) every worker collects, and a worker's
    # terminal reporter writes nowhere: the first worker says the lines, on stderr, once
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker not in (None, "gw0"):
        return
    lines = report_lines(items)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    for line in lines:
        if reporter is not None and worker is None:
            reporter.write_line(line, yellow=True, bold=True)
        else:
            print(line, file=sys.stderr)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    for need in item.stash.get(_KEY, []):
        why = why_missing(need)
        if why is None:
            continue
        message = f"{need.name} missing: {why}"
        if os.environ.get("CI") and need.in_ci:
            pytest.fail(f"{message} (CI is set: these tests must run, not skip)", pytrace=False)
        pytest.skip(message)
