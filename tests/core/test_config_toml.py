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
