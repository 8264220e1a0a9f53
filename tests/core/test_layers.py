"""Layers point one way: each rule reads every module's imports (module level and inside functions).

A layer that reaches up makes the lower one depend on the policy or presentation above it
(the dashboard on the CLI, the fleet on the judge), and raw SQL outside the ledger package
bypasses the ledger's contract (one transaction per write, frozen rows). Each rule below lists
the offending `module -> import` pairs, so a failure says exactly which line to move.

Run: `.venv/bin/python -m pytest tests/core/test_layers.py -q`
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nightlab

PACKAGE = Path(nightlab.__file__).parent

# A statement, not prose: a keyword that opens SQL followed by what only SQL puts after it.
_SQL = re.compile(
    r"^\s*(SELECT\b.+\bFROM\b|INSERT\s+(OR\s+\w+\s+)?INTO\b|UPDATE\s+\w+\s+SET\b|DELETE\s+FROM\b"
    r"|CREATE\s+(TABLE|INDEX)\b|ALTER\s+TABLE\b|PRAGMA\s+\w+|BEGIN(\s+IMMEDIATE)?\s*$)",
    re.DOTALL,  # case-sensitive: this codebase writes SQL keywords in capitals, prose never does
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, ast.Module]:
    return {_module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(PACKAGE.rglob("*.py"))}


MODULES = _modules()


def _imports(name: str, tree: ast.Module) -> set[str]:
    """Every nightlab module `name` imports, anywhere in its body (`from a import b` counts a and a.b)."""
    package = (
        name if (PACKAGE.parent / Path(*name.split("."), "__init__.py")).exists() else name.rsplit(".", 1)[0]
    )
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in out if m == "nightlab" or m.startswith("nightlab.") or m == "sqlite3"}


IMPORTS = {name: _imports(name, tree) for name, tree in MODULES.items()}


def _within(module: str, layer: str) -> bool:
    return module == layer or module.startswith(layer + ".")


def _reaching(frm: str, to: tuple[str, ...], *, allow: tuple[str, ...] = ()) -> list[str]:
    """`module -> import` pairs where a module of layer `frm` imports one of the layers `to`."""
    return sorted(
        f"{m} -> {i}"
        for m, imports in IMPORTS.items()
        if _within(m, frm) and not any(_within(m, a) for a in allow)
        for i in imports
        if any(_within(i, t) for t in to)
    )


def test_every_layer_a_rule_names_exists():
    # a rule naming a package that was renamed away (`nightlab.research` is `nightlab.search_loop`
    # since issue 33) checks nothing and passes forever: every module name written here must exist
    source = ast.parse(Path(__file__).read_text())
    named = {
        node.value
        for node in ast.walk(source)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"nightlab(\.\w+)*", node.value)
    }
    missing = [n for n in named if not any(_within(m, n) for m in MODULES)]  # fleet/ has no __init__
    assert "nightlab.search_loop" in named and missing == []


def test_the_scan_sees_imports_inside_functions():
    # the package imports lazily (`--help` stays fast): a scan of module-level imports alone would miss them
    assert "nightlab.views" in IMPORTS["nightlab.web._views"]
    assert (
        "nightlab.ledger" in IMPORTS["nightlab.cli.status"]
        or "nightlab.views" in IMPORTS["nightlab.cli.status"]
    )
    assert _reaching("nightlab.cli", ("nightlab.ledger",))  # the rule helper finds real edges


def test_the_dashboard_does_not_import_the_cli():
    assert _reaching("nightlab.web", ("nightlab.cli",)) == []


def test_only_the_cli_and_the_entry_point_import_the_cli():
    outside = [
        pair for pair in _reaching("nightlab", ("nightlab.cli",), allow=("nightlab.cli", "nightlab.__main__"))
    ]
    assert outside == []


def test_views_import_neither_the_cli_nor_the_dashboard():
    assert _reaching("nightlab.views", ("nightlab.cli", "nightlab.web")) == []


def test_the_fleet_does_not_reach_up_to_analysis_the_search_loop_or_the_lab():
    # the verdict policy is handed to the controller (`nightlab.judge.Judge`), not imported from analysis
    above = ("nightlab.analysis", "nightlab.search_loop", "nightlab.waves", "nightlab.lab", "nightlab.cli")
    assert _reaching("nightlab.fleet", (*above, "nightlab.web", "nightlab.views", "nightlab.report")) == []


def test_search_does_not_import_the_lab():
    # search/ is pure logic over knobs, spaces and figures; the lab (and search_loop/, the loop that
    # runs it on a lab) drives it, never the reverse
    assert (
        _reaching(
            "nightlab.search", ("nightlab.lab", "nightlab.search_loop", "nightlab.waves", "nightlab.cli")
        )
        == []
    )


def test_the_ledger_imports_nothing_above_it():
    above = ("nightlab.lab", "nightlab.analysis", "nightlab.fleet", "nightlab.search", "nightlab.views")
    above += ("nightlab.web", "nightlab.cli", "nightlab.search_loop", "nightlab.waves", "nightlab.report")
    assert _reaching("nightlab.ledger", above) == []


def test_only_the_ledger_package_imports_sqlite3():
    assert _reaching("nightlab", ("sqlite3",), allow=("nightlab.ledger",)) == []


def test_no_sql_outside_the_ledger_package():
    found = []
    for name, tree in MODULES.items():
        if _within(name, "nightlab.ledger"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _SQL.match(node.value):
                found.append(f"{name}:{node.lineno}: {node.value.strip()[:60]!r}")
            # `ledger._query(...)` / `ledger._conn`: SQL run through the ledger's private plumbing
            if isinstance(node, ast.Attribute) and node.attr in ("_query", "_conn"):
                found.append(f"{name}:{node.lineno}: .{node.attr}")
    assert found == []


def test_the_sql_detector_tells_statements_from_prose():
    assert _SQL.match("SELECT id FROM experiments WHERE x = ?")
    assert _SQL.match("  UPDATE experiments SET verdict = ?")
    assert _SQL.match("PRAGMA quick_check(1)")
    assert not _SQL.match("select the best run from the wave")
    assert not _SQL.match("Update the incumbent")
    assert not _SQL.match("delete the lock file")


def test_the_fleet_does_not_import_the_trackers():
    # the controller keeps the trackers' worker running as a command line (`fleet.sidecar`): the
    # fleet never loads the trackers or their libraries, and a tracker cannot reach its loop
    assert _reaching("nightlab.fleet", ("nightlab.trackers",)) == []
    assert _reaching("nightlab.ledger", ("nightlab.trackers",)) == []


def test_the_cluster_words_are_a_leaf_and_the_cost_report_needs_no_skypilot_backend():
    # `nightlab report` imports fleet/costs.py: it reads the cluster events without the backend
    assert IMPORTS["nightlab.fleet.cluster_states"] == set()
    assert _reaching("nightlab.fleet.costs", ("nightlab.fleet.skypilot",)) == []
