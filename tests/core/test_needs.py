"""Nothing skipped silently (tests/needs.py, issue 31): a run on a machine without bubblewrap,
chromium and npm says, before the first test, what each costs and how to install it; the tests
that need them skip with that reason, or fail under CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

INNER = """
import pytest


@pytest.fixture
def browser_page():
    return None


@pytest.fixture
def bins():
    return None


@pytest.mark.sandbox
def test_sandboxed():
    pass


@pytest.mark.sandbox
def test_sandboxed_too():
    pass


def test_browser(browser_page):
    pass


def test_agents(bins):
    pass


def test_plain():
    pass
"""


def run(tmp_path: Path, *extra: str, **env: str) -> subprocess.CompletedProcess:
    """The inner tests on a PATH without bwrap, chromium and npm (an empty folder) and no CLI cache."""
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "bin").mkdir(exist_ok=True)
    full = {k: v for k, v in os.environ.items() if k not in ("CI", "NIGHTLAB_NO_SANDBOX")}
    full.update(
        PATH=str(tmp_path / "bin"),
        NIGHTLAB_AGENT_CLI_CACHE=str(tmp_path / "clis"),
        PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        **env,
    )
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-rs",
        "-p",
        "needs",
        "-p",
        "no:cacheprovider",
        *extra,
        "test_inner.py",
    ]
    # one stream, as a terminal shows it: under xdist the lines come on stderr, the dots on stdout
    return subprocess.run(
        argv, cwd=tmp_path, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300
    )


def test_missing_pieces_are_said_before_the_first_test_and_skip_what_needs_them(tmp_path):
    proc = run(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:3] == [
        "bubblewrap missing: the 2 sandbox and red-team tests will not run: bwrap not found; "
        "install bubblewrap (`apt-get install bubblewrap`) to sandbox runs",
        "chromium missing: the 1 real-browser dashboard test will not run: chromium not found: "
        "`apt-get install chromium` (never `playwright install`)",
        "npm missing: the 1 real agent CLI test will not run: npm not found: "
        "`apt-get install nodejs npm` (the tests install the pinned CLIs with it)",
    ]
    assert lines[3].startswith("ssss.")  # the first test runs after them
    assert "1 passed, 4 skipped" in proc.stdout
    assert "SKIPPED [2] " in proc.stdout and "bubblewrap missing: bwrap not found" in proc.stdout


def test_under_ci_a_missing_piece_fails_its_tests(tmp_path):
    proc = run(tmp_path, CI="true")
    assert proc.returncode == 1
    assert "(CI is set: they fail)" in proc.stdout.splitlines()[0]
    assert "1 passed, 4 errors" in proc.stdout and "CI is set: these tests must run, not skip" in proc.stdout


def test_pieces_that_are_here_are_not_mentioned_and_no_sandbox_is_missing_bubblewrap(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("chromium", "npm"):  # stand-ins: only their presence on PATH is checked
        (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / name).chmod(0o755)
    proc = run(tmp_path, NIGHTLAB_NO_SANDBOX="1")
    lines = proc.stdout.splitlines()
    # bubblewrap is here only when it can sandbox: NIGHTLAB_NO_SANDBOX turns it off, and says how back
    assert lines[0] == (
        "bubblewrap missing: the 2 sandbox and red-team tests will not run: "
        "NIGHTLAB_NO_SANDBOX=1 is set; unset it to sandbox runs"
    )
    assert lines[1].startswith("ss...")  # chromium and npm were found: their tests ran


def test_under_xdist_the_first_worker_says_each_line_once_before_the_first_test(tmp_path):
    """`make test TEST_WORKERS=2` runs two pytest-xdist workers; each collects, and a worker's terminal reporter
    writes nowhere: without the first worker saying them on stderr, the lines were lost."""
    proc = run(tmp_path, "-n", "2", "--dist", "loadfile")
    assert proc.returncode == 0, proc.stdout
    lines = proc.stdout.splitlines()
    said = [i for i, line in enumerate(lines) if " missing: the " in line]
    assert [lines[i].split(" missing:")[0] for i in said] == ["bubblewrap", "chromium", "npm"], proc.stdout
    first_test = next(i for i, line in enumerate(lines) if line.startswith(("s", ".")))
    assert said[-1] < first_test, proc.stdout
    assert "1 passed, 4 skipped" in proc.stdout
