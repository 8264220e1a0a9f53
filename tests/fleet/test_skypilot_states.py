"""The SkyPilot backend's states are enums, so a misspelt one fails where it is written.

A comparison such as `cluster.state == "lanching"` is quietly never true: the run waits for a
state that cannot come. With `ClusterState.LANCHING` the same typo is an AttributeError the first
time the line runs. These tests read the backend's source (no SkyPilot needed) and check the
one boundary where plain words stay on purpose: the runner's files (`resident.py`, shipped as
text to the cluster) report a run's state in words that `feeds.RemoteState` must know.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import nightlab.fleet.skypilot as skypilot_package
from nightlab.fleet.cluster_states import ClusterState
from nightlab.fleet.skypilot import resident
from nightlab.fleet.skypilot.feeds import RemoteState
from nightlab.fleet.skypilot.jobs import RunState
from nightlab.fleet.skypilot.residents import ResidentState

PACKAGE = Path(skypilot_package.__file__).parent
SHIPPED = {"resident.py"}  # runs on the cluster, stdlib only: its wire words stay strings


def _is_state(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "state") or (
        isinstance(node, ast.Name) and node.id == "state"
    )


def _words(node: ast.AST | None) -> bool:
    """A string literal, or a tuple / list / set holding one."""
    if node is None:
        return False
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_words(e) for e in node.elts)
    if isinstance(node, ast.IfExp):
        return _words(node.body) or _words(node.orelse)
    return False


def bare_state_words(source: str) -> list[int]:
    """Lines where a state is compared with, or set to, a string literal."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_state(s) for s in sides) and any(_words(s) for s in sides):
                lines.append(node.lineno)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names = target.elts if isinstance(target, ast.Tuple) else [target]
                values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                if any(_is_state(t) and _words(v) for t, v in zip(names, values, strict=False)):
                    lines.append(node.lineno)
        elif isinstance(node, ast.AnnAssign) and _is_state(node.target) and _words(node.value):
            lines.append(node.lineno)
    return sorted(lines)


def test_no_state_of_the_backend_is_a_bare_string():
    found = {
        path.name: bare_state_words(path.read_text())
        for path in sorted(PACKAGE.glob("*.py"))
        if path.name not in SHIPPED
    }
    assert {name: lines for name, lines in found.items() if lines} == {}


def test_the_check_sees_a_bare_state():
    source = 'if run.state == "runing":\n    cluster.state, x = "up", 1\nstate: str = "waiting"\n'
    source += 'c.state = ClusterState.UP if up else "down"\n'
    assert bare_state_words(source) == [1, 2, 3, 4]
    assert bare_state_words("if run.state == RunState.RUNNING:\n    pass\n") == []


def test_the_stored_and_printed_words_are_the_old_ones():
    """`fleet up` prints cluster states and `sky.json` / the logs carry none of these as names."""
    assert [s.value for s in ClusterState] == ["unknown", "checking", "down", "launching", "up", "failed"]
    assert [s.value for s in RunState] == ["waiting", "running", "fetching", "done"]
    assert [s.value for s in ResidentState] == ["attaching", "starting", "ready", "retiring", "dead"]
    assert f"{ClusterState.UP}" == "up" and str(RunState.DONE) == "done"


def test_every_word_the_runner_files_report_is_a_remote_state(tmp_path):
    """`resident.state_of` (shipped, plain strings) and `RemoteState` (controller) agree word for word."""
    epoch = tmp_path / "epoch"
    for sub in ("inbox", "claimed", "tomb", "runs"):
        (epoch / sub).mkdir(parents=True)

    def mark(*parts: str) -> None:
        path = epoch.joinpath(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")

    os.makedirs(epoch / "runs" / "limbo")
    os.makedirs(epoch / "runs" / "queued")
    mark("inbox", "0001.queued")
    mark("claimed", "running")
    mark("runs", "done", "status.json")
    mark("tomb", "dropped")
    names = ["unknown", "limbo", "queued", "running", "done", "dropped"]
    seen = [RemoteState.of(resident.state_of(str(epoch), name)) for name in names]
    assert seen == list(RemoteState)
    assert RemoteState.of(None) == RemoteState.UNKNOWN  # a run missing from the answer
