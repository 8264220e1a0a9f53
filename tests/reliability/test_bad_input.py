"""Bad input, property-based: `nightlab.toml`, `--set` values, `--space` specs and experiment
ids (`../`, NUL, unicode, very long) are rejected with one line and exit 2, and nothing is
written: the ledger, the snapshot refs and the working tree are as they were.

The CLI runs in-process (`nightlab.cli.main`, exactly what the `nightlab` script calls), so
hypothesis can try hundreds of inputs, NUL bytes included (argv cannot carry those).
"""

from __future__ import annotations

import contextlib
import io
import sqlite3
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from labkit import commit, nightlab
from nightlab.cli import main
from nightlab.config import parse_config, tomllib
from nightlab.errors import ConfigError, UsageError

SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
HOSTILE = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [
            "../e0001",
            "../../etc/passwd",
            "e0001/../e0001",
            "/etc/passwd",
            "e0001\0",
            "\0",
            "e0001\n",
            "e0001' OR '1'='1",
            "%s%n",
            "*",
            "é0001",
            "e" + "0" * 10_000,
            "-1",
            "e-1",
            "",
            " ",
            "\u202e1000e",
        ]
    ),
    st.builds(lambda a, b: a + b, st.sampled_from(["e", "e0", "../", "w"]), st.text(max_size=20)),
)


def run_cli(*args: str) -> tuple[int, str, str]:
    """`nightlab ARGS` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def state(lab: Path) -> tuple:
    """Everything a failed command must leave unchanged."""
    conn = sqlite3.connect(f"{(lab / '.nightlab' / 'ledger.db').as_uri()}?mode=ro", uri=True)
    try:
        rows = tuple(
            conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
            for t in ("experiments", "events", "waves", "attempts")
        )
    finally:
        conn.close()
    refs = subprocess.run(["git", "for-each-ref", "refs/"], cwd=lab, capture_output=True, text=True).stdout
    tree = subprocess.run(["git", "status", "--porcelain"], cwd=lab, capture_output=True, text=True).stdout
    runs = (
        sorted(p.name for p in (lab / ".nightlab" / "runs").glob("*"))
        if (lab / ".nightlab" / "runs").exists()
        else []
    )
    return rows, refs, tree, tuple(runs)


def assert_rejected(code: int, out: str, err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (code, out, err)
    assert len(lines) == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    return lines[0]


@pytest.fixture
def lab(make_lab, monkeypatch):
    path = make_lab(slots=1)
    nightlab("fleet", "stop", cwd=path, check=False)
    code, out, err = 0, "", ""
    monkeypatch.setenv("NIGHTLAB_DIR", str(path))
    code, out, err = run_cli("submit", "-m", "the one experiment", "--no-start", "--json")
    assert code == 0, err
    return path


# ---------------------------------------------------------------------------- experiment ids


@SETTINGS
@given(eid=HOSTILE)
@example(
    eid="-1"
)  # found by bench/reliability.py: click's 4-line usage error for an id that looks like an option
@example(eid="\0")
@example(eid="../e0001")
@example(eid="e" + "0" * 10_000)
def test_hostile_experiment_ids_are_rejected(lab, eid):
    assume(eid != "e0001")
    before = state(lab)
    for args in (
        ("show", eid),
        ("cancel", eid),
        ("wait", eid, "--timeout", "1"),
        ("adopt", eid),
        ("submit", "-m", "again", "--from", eid, "--no-start"),
    ):
        line = assert_rejected(*run_cli(*args))
        assert "\0" not in line
    assert state(lab) == before


# ---------------------------------------------------------------------------- --set


SET_NAMES = st.one_of(
    st.sampled_from(["LR", "SLEEP", "MODE", "NOISE", "lr", "LR ", "PATH", "__import__"]), st.text(max_size=12)
)
SET_VALUES = st.one_of(
    st.sampled_from(
        [
            "",
            "1e309",
            "-1e309",
            "nan",
            "inf",
            "__import__('os')",
            "open('x')",
            "1;2",
            "'unterminated",
            "0.02\n",
            "(" * 200,
            "-" * 5000 + "1",
            "\0",
            "1 if 1 else 2",
            "[1]*10**9",
            "9**9**9",
            "LR",
        ]
    ),
    st.text(max_size=30),
)


@SETTINGS
@given(name=SET_NAMES, value=SET_VALUES)
def test_bad_set_values_are_rejected_and_write_nothing(lab, name, value):
    before = state(lab)
    code, out, err = run_cli(
        "submit", "-m", "set", "--set", f"{name}={value}", "--no-start", "--force", "--json"
    )
    if code == 0:  # a value that really is a literal for a real knob: queued, and that is right
        assert name.strip() in ("LR", "SLEEP", "MODE", "NOISE"), (name, value)
        return
    assert_rejected(code, out, err)
    assert state(lab) == before


# ---------------------------------------------------------------------------- --space


SPACE_BODIES = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        [
            "log(0,1)",
            "log(-1,1)",
            "uniform(1,1)",
            "uniform(-1e309,1e309)",
            "int(5,1)",
            "int(0.5,2)",
            "pow2(3,8)",
            "pow2(0,8)",
            "1",
            "1,1",
            "foo(1,2)",
            "log(1,2",
            "(1,2),",
            "1," * 500 + "2",
            "-" * 5000 + "1,2",
            "\0",
            "uniform(nan,1)",
            "int(1,2,3)",
            "log()",
            "",
        ]
    ),
)


@SETTINGS
@given(name=st.sampled_from(["LR", "NOISE", "BOGUS", "", "1X", "../LR"]), body=SPACE_BODIES)
def test_bad_space_specs_are_rejected_and_write_nothing(lab, name, body):
    from nightlab.search.spaces import parse_space

    spec = f"{name}={body}"
    try:
        parse_space(spec)
        assume(name not in ("LR", "NOISE"))  # a valid space for a real knob would queue a wave
    except UsageError:
        pass
    before = state(lab)
    line = assert_rejected(*run_cli("sweep", spec, "-m", "sweep"))
    assert line.startswith("error: ")
    assert state(lab) == before


# ---------------------------------------------------------------------------- nightlab.toml


def _valid_doc() -> dict:
    return {
        "target": {"command": "python train.py", "editable": ["train.py"], "timeout": 60, "builtin": False},
        "metric": {"name": "val_bpb", "direction": "lower"},
        "fleet": {
            "default_tier": "cpu",
            "idle_shutdown": 60,
            "retries": 2,
            "pool": [{"backend": "local", "tier": "cpu", "slots": 2}],
        },
        "search": {"z": 2.0, "incumbent_max_age_waves": 3, "promote_top_k": 3},
    }


TOML_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(),
    st.text(max_size=20),
    st.sampled_from(["../../etc/passwd", "/abs", "", " ", "a\0b", "val bpb", "h100 gpu"]),
    st.lists(st.one_of(st.integers(-3, 3), st.text(max_size=5)), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)
TOML_KEYS = st.sampled_from(
    [
        "target.command",
        "target.editable",
        "target.timeout",
        "target.builtin",
        "metric.name",
        "metric.direction",
        "fleet.default_tier",
        "fleet.idle_shutdown",
        "fleet.retries",
        "fleet.backup_interval",
        "fleet.backups",
        "search.z",
        "search.incumbent_max_age_waves",
        "search.promote_top_k",
        "fleet.pool.0.slots",
        "fleet.pool.0.tier",
        "fleet.pool.0.threads",
        "fleet.pool.0.gpus",
        "fleet.pool.0.backend",
        "target.bogus",
    ]
)


@settings(max_examples=400, deadline=None)
@given(key=TOML_KEYS, value=TOML_VALUES)
@example(key="fleet.pool.0.backend", value="\n")  # found by hypothesis: the value was quoted raw
@example(key="fleet.pool.0.tier", value="a\x1b[2Jb")
def test_config_values_are_checked_or_sane(key, value):
    import math

    doc = _valid_doc()
    *path, last = key.split(".")
    node = doc
    for part in path:
        node = node[int(part)] if part.isdigit() else node[part]
    if value is None:
        node.pop(last, None)
    else:
        node[last] = value
    try:
        config = parse_config(doc)
    except ConfigError as e:
        assert "\n" not in str(e) and str(e).startswith("nightlab.toml")
        return
    # accepted: then every number is one the lab can live by
    assert math.isfinite(config.target.timeout) and config.target.timeout > 0
    assert config.target.command.strip()
    assert all(not Path(e).is_absolute() and ".." not in Path(e).parts for e in config.target.editable)
    assert math.isfinite(config.fleet.idle_shutdown) and config.fleet.idle_shutdown >= 0
    assert config.fleet.retries >= 0 and config.fleet.backups >= 1 and config.fleet.backup_interval > 0
    assert all(p.slots >= 1 for p in config.fleet.pools)
    assert math.isfinite(config.search.z) and config.search.z > 0
    assert config.search.promote_top_k >= 1 and config.search.incumbent_max_age_waves >= 1
    assert config.metric.name and " " not in config.metric.name


@pytest.mark.parametrize(
    "edit",
    [
        ("timeout = 60", "timeout = nan"),
        ("timeout = 60", "timeout = -inf"),
        ('editable = ["train.py"]', 'editable = ["../outside.py"]'),
        ('name = "val_bpb"', 'name = "val bpb"'),
        ("retries = 2", "retries = -1"),
        ("[fleet]", "[fleet\n"),
        ("z = 2.0", "z = 0"),
    ],
)
def test_bad_toml_is_one_line_exit_2_and_writes_nothing(lab, edit):
    """Committed, a bad nightlab.toml refuses every command; only in the working copy, it is
    ignored with one warning and the committed file is in force."""
    toml = lab / "nightlab.toml"
    original = toml.read_text()
    assert edit[0] in original, edit
    toml.write_text(original.replace(edit[0], edit[1], 1))
    committed = False
    try:
        code, out, err = run_cli("results", "--json")
        [warning] = err.splitlines()
        assert code == 0 and '"e0001"' in out, err
        assert warning.startswith("warning: the uncommitted nightlab.toml is broken and ignored"), warning
        commit(lab, "a bad config", "nightlab.toml")
        committed = True
        before = state(lab)
        for args in (("status",), ("submit", "-m", "x", "--no-start"), ("results",)):
            line = assert_rejected(*run_cli(*args))
            assert "nightlab.toml" in line
        assert state(lab) == before
    finally:
        toml.write_text(original)
        if committed:
            commit(lab, "the good config", "nightlab.toml")


def test_tomllib_is_the_parser():  # the committed file is parsed by the standard library, not by hand
    assert tomllib.loads("a = nan")["a"] != tomllib.loads("a = nan")["a"]
