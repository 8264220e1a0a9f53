"""nightlab.toml validation: every bad key is named."""

from __future__ import annotations

import re

import pytest

from nightlab.config import PoolConfig, parse_config
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


def test_a_key_left_out_reads_as_its_dataclass_field_default():
    """Defaults are written once, on the dataclass fields (issue 33): every section parsed from a
    document that leaves its keys out equals the field defaults, one by one."""
    from dataclasses import MISSING, fields

    doc = {
        "target": BASE["target"],
        "fleet": {"pool": [{"tier": "cpu"}, {"backend": "skypilot", "tier": "h100"}]},
        "trackers": {"wandb": {"project": "p"}, "mlflow": {"tracking_uri": "http://127.0.0.1:5000"}},
    }
    cfg = parse_config(doc)
    sections = [cfg.target, cfg.metric, cfg.fleet, cfg.fleet.pools[0], cfg.search, cfg.agent]
    checked = []
    for section in [*sections, cfg.trackers.wandb, cfg.trackers.mlflow]:
        for f in fields(section):
            if f.default is not MISSING:
                assert getattr(section, f.name) == f.default, f"{type(section).__name__}.{f.name}"
            elif f.default_factory is not MISSING:
                assert getattr(section, f.name) == f.default_factory(), f"{type(section).__name__}.{f.name}"
            else:
                continue
            checked.append(f"{type(section).__name__}.{f.name}")
    assert {
        "TargetConfig.timeout",
        "FleetConfig.retries",
        "AgentConfig.token_prices",
        "PoolConfig.slots",
    } <= set(checked)
    assert len(checked) >= 30 and cfg.profile is None
    assert cfg.fleet.pools[1].slots == PoolConfig.slots  # a skypilot pool's `workers`
    assert cfg.fleet.default_tier == "cpu"  # the one default that is not a constant: the first pool's tier


def test_a_field_takes_the_type_of_its_annotation():
    cfg = parse_config(with_(search__z=3, target__timeout=60))
    assert cfg.search.z == 3.0 and type(cfg.search.z) is float and type(cfg.target.timeout) is float
    assert cfg.target.editable == ("train.py",)  # a TOML list is a tuple in the frozen config


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"target__timeout": -1}, "`target.timeout` must be positive, got `-1.0`"),
        (
            {"target__editable": ["ok.py", "../x.py"]},
            "`target.editable` entry `'../x.py'` must be a file path",
        ),
        ({"metric__direction": "down"}, "`metric.direction` is `down`; use `lower` or `higher`"),
        ({"fleet__min_cpu_share": 1.5}, "`fleet.min_cpu_share` must be between 0 (off) and 1, got `1.5`"),
        ({"fleet__retries": True}, "`fleet.retries` must be an integer, got `True`"),
        (
            {"fleet__pool": [{"tier": "cpu", "gpus": [0, -1]}]},
            "`fleet.pool[0].gpus` must be a list of GPU indices, got `(0, -1)`",
        ),
        (
            {"fleet__pool": [{"tier": "cpu", "budget_seconds": -1}]},
            "must be a positive number of seconds, e.g. `10`, got `-1`",
        ),
        (
            {"fleet__pool": [{"tier": "cpu", "backend": "slurm"}]},
            "`fleet.pool[0].backend` is `slurm`; use `local` or `skypilot`",
        ),
        ({"search__eta": 1}, "`search.eta` must be at least 2 (3 promotes the top third), got `1`"),
        ({"agent__commands": {"mine": " "}}, "`agent.commands.mine` must be a non-empty command line"),
        (
            {"agent__stall_seconds": -5},
            "`agent.stall_seconds` must be positive and `agent.max_restarts_per_hour` at least 1, got `-5` and `6`",
        ),
        (
            {"trackers__wandb": {"project": "a/b"}},
            "`trackers.wandb.project` is `'a/b'`; use letters, digits, `_`, `.`, `-`",
        ),
    ],
)
def test_one_line_errors_read_as_before(patch, message):
    """The messages the schema's checks format, word for word (a `nightlab.toml: ` line each)."""
    with pytest.raises(ConfigError) as caught:
        parse_config(with_(**patch))
    assert str(caught.value).startswith("nightlab.toml: `") and message in str(caught.value)
    assert "\n" not in str(caught.value)
