"""nightlab.toml validation: every bad key is named."""

from __future__ import annotations

import re

import pytest

from nightlab.config import parse_config
from nightlab.errors import ConfigError

BASE = {
    "target": {"command": "python train.py", "editable": ["train.py"]},
    "fleet": {"pool": [{"backend": "local", "tier": "cpu", "slots": 2}]},
}


def with_(**patch):
    doc = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    for dotted, value in patch.items():
        table, key = dotted.split("__")
        doc.setdefault(table, {})[key] = value
    return doc


def test_defaults():
    cfg = parse_config(BASE)
    assert cfg.target.timeout == 600
    assert cfg.metric.name == "val_bpb" and cfg.metric.lower_is_better
    assert cfg.fleet.default_tier == "cpu" and cfg.fleet.tiers == ["cpu"]
    assert cfg.search.z == 2.0


@pytest.mark.parametrize(
    ("patch", "named"),
    [
        ({"target__timeout": "soon"}, "target.timeout"),
        ({"target__timeout": -1}, "target.timeout"),
        ({"target__editable": []}, "target.editable"),
        ({"target__tiemout": 3}, "target.tiemout"),
        ({"metric__direction": "down"}, "metric.direction"),
        ({"fleet__default_tier": "h100"}, "fleet.default_tier"),
        ({"fleet__pool": [{"backend": "slurm", "tier": "x"}]}, "fleet.pool[0].backend"),
        ({"fleet__pool": [{"backend": "local", "tier": "cpu", "slots": True}]}, "fleet.pool[0].slots"),
        ({"fleet__pool": [{"backend": "local"}]}, "fleet.pool[0].tier"),
        ({"search__z": "two"}, "search.z"),
    ],
)
def test_bad_keys_are_named(patch, named):
    with pytest.raises(ConfigError, match=re.escape(f"`{named}`")):
        parse_config(with_(**patch))


def test_missing_target_table():
    with pytest.raises(ConfigError, match=r"\[target\]"):
        parse_config({"fleet": BASE["fleet"]})


def test_a_broken_working_copy_is_ignored_with_its_line_named(tmp_path):
    """The committed file is in force; a broken edit beside it is named, never fatal (issue 32)."""
    import subprocess

    from labkit import commit
    from nightlab.config import load_lab_config
    from nightlab.doctor import _load_config

    good = '[target]\ncommand = "python train.py"\neditable = ["train.py"]\n\n[[fleet.pool]]\ntier = "cpu"\n'
    toml = tmp_path / "nightlab.toml"
    toml.write_text(good)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "nightlab.toml"], cwd=tmp_path, check=True)
    commit(tmp_path, "config", "nightlab.toml")
    assert load_lab_config(tmp_path).warning is None
    toml.write_text(good + "[fleet\n")
    loaded = load_lab_config(tmp_path)
    assert loaded.config == parse_config({**BASE, "fleet": {"pool": [{"tier": "cpu"}]}})
    assert loaded.uncommitted and "(at line 7, column 7)" in (loaded.broken or "")
    assert loaded.warning is not None and loaded.warning.startswith(
        "warning: the uncommitted nightlab.toml is broken and ignored (nightlab.toml is not valid TOML:"
    )
    _, [check] = _load_config(tmp_path)
    assert not check.ok and "line 7" in check.detail and check.fix == "git checkout nightlab.toml"
    toml.write_text(good.replace('tier = "cpu"', 'tier = "cpu"\nslots = "two"'))
    assert "`fleet.pool[0].slots`" in (load_lab_config(tmp_path).broken or "")
    toml.write_text(good.replace("python", "python3"))
    loaded = load_lab_config(tmp_path)
    assert loaded.broken is None and loaded.warning is not None and "uncommitted edits" in loaded.warning
    assert loaded.config.target.command == "python train.py"


@pytest.mark.parametrize(
    ("command", "editable", "entry"),
    [
        ("python train.py", ["train.py"], ("train.py",)),
        ("uv run ./train.py --fast", ["model.py", "train.py"], ("train.py",)),
        ("bash scripts/run.sh", ["scripts/run.sh", "train.py"], ("scripts/run.sh",)),
        ("python -m mypkg.train", ["mypkg/train.py"], ()),  # not knowable from the command line
        ("python 'unbalanced", ["train.py"], ()),
    ],
)
def test_entry_files_are_the_editable_files_the_command_names(command, editable, entry):
    cfg = parse_config({**BASE, "target": {"command": command, "editable": editable}})
    assert cfg.target.entry_files == entry
