"""Profiles: built-in constants, overrides, the [profile] table, the fingerprint, the data dir."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from nightlab.errors import ConfigError, NotALabError, UsageError
from nightlab.harness.profiles import (
    PROFILES,
    SOURCE_VERSIONS,
    Profile,
    data_dir,
    fingerprint,
    get_profile,
    load_lab_profile,
    source_version,
)


def test_h100_is_autoresearch():
    p = PROFILES["h100"]
    assert (p.dataset, p.vocab_size, p.seq_len, p.budget_seconds, p.eval_tokens) == (
        "climbmix",
        8192,
        2048,
        300.0,
        40 * 524288,
    )


def test_small_profiles_fit_their_hardware():
    gpu, cpu = PROFILES["small-gpu"], PROFILES["cpu"]
    assert (
        gpu.dataset == "tinystories" and gpu.seq_len < 2048 and gpu.eval_tokens < PROFILES["h100"].eval_tokens
    )
    assert cpu.dataset == "demo" and cpu.seq_len == 256 and 10 <= cpu.budget_seconds < 60
    assert 1024 <= cpu.vocab_size <= 2048 and cpu.eval_tokens <= 2**16
    for p in PROFILES.values():
        assert all(k.isupper() for k in p.train_defaults)
        assert all(isinstance(eval(v), int) for v in p.train_defaults.values())  # Python literal sources


def test_dict_round_trip():
    for p in PROFILES.values():
        assert Profile.from_dict(p.to_dict()) == p


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"vocab": 1}, "profile.vocab"),
        ({"vocab_size": True}, "profile.vocab_size"),
        ({"seq_len": "256"}, "profile.seq_len"),
        ({"dataset": "imagenet"}, "imagenet"),
        ({"budget_seconds": 0}, "profile.budget_seconds"),
        ({"train_defaults": {"depth": "2"}}, "profile.train_defaults"),
    ],
)
def test_from_dict_names_the_bad_key(change, named):
    d = {**PROFILES["cpu"].to_dict(), **change}
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        Profile.from_dict(d)


def test_from_dict_missing_key():
    d = PROFILES["cpu"].to_dict()
    del d["eval_tokens"]
    with pytest.raises(ConfigError, match=r"missing key `profile\.eval_tokens`"):
        Profile.from_dict(d)


def test_get_profile_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    assert get_profile("cpu") == PROFILES["cpu"]
    longer = get_profile("cpu", budget=120)
    assert longer.budget_seconds == 120.0 and fingerprint(longer) == fingerprint(PROFILES["cpu"])
    monkeypatch.chdir(tmp_path)
    local = get_profile("cpu", dataset="local:texts")
    assert local.dataset == f"local:{tmp_path / 'texts'}"
    assert fingerprint(local) != fingerprint(PROFILES["cpu"])
    assert get_profile("h100", dataset="climbmix:3").dataset == "climbmix:3"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "tpu"}, "unknown profile `tpu`; known profiles: h100, small-gpu, cpu"),
        ({"name": "cpu", "budget": -5}, "budget `-5`"),
        ({"name": "cpu", "dataset": "climbmix:0"}, "climbmix:0"),
        ({"name": "cpu", "dataset": "local:"}, "unknown dataset `local:`"),
        ({"name": "cpu", "dataset": "demo:2"}, "unknown dataset `demo:2`"),
    ],
)
def test_get_profile_rejects(kwargs, match):
    with pytest.raises(UsageError, match=match):
        get_profile(**kwargs)


def test_fingerprint_covers_what_decides_the_tokens():
    base = PROFILES["cpu"]
    fp = fingerprint(base)
    assert len(fp) == 16 and int(fp, 16) >= 0
    for change in (
        {"vocab_size": 2048},
        {"seq_len": 512},
        {"eval_tokens": 2**14},
        {"dataset": "tinystories"},
    ):
        assert fingerprint(dataclasses.replace(base, **change)) != fp, change
    for change in ({"budget_seconds": 99.0}, {"name": "mine"}, {"train_defaults": {"DEPTH": "6"}}):
        assert fingerprint(dataclasses.replace(base, **change)) == fp, change
    assert fingerprint(get_profile("h100", dataset="climbmix:10")) == fingerprint(PROFILES["h100"])


def test_a_source_version_moves_only_its_own_labs():
    """demo's split changed (issue 30): its fingerprint and epoch move, every other source's stay put."""
    # the fingerprints before SOURCE_VERSIONS existed: other labs keep their data folders
    before = {"demo": "864e63dd6f45cd0c", "tinystories": "9f815c77cb5530a7", "local:/x/y": "bc6cf4432aec5961"}
    now = {d: fingerprint(get_profile("cpu", dataset=d)) for d in before}
    assert now["demo"] != before["demo"]
    assert {d: f for d, f in now.items() if d != "demo"} == {d: f for d, f in before.items() if d != "demo"}
    assert source_version("demo") == SOURCE_VERSIONS["demo"] and source_version("tinystories") is None


def test_data_dir_uses_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("NIGHTLAB_DATA_DIR", str(tmp_path))
    assert data_dir(PROFILES["cpu"]) == tmp_path / fingerprint(PROFILES["cpu"])
    monkeypatch.delenv("NIGHTLAB_DATA_DIR")
    assert data_dir(PROFILES["cpu"]).parent == Path.home() / ".cache" / "nightlab" / "data"


def _toml(profile: Profile) -> str:
    d = profile.to_dict()
    defaults = d.pop("train_defaults")
    lines = ["[target]", 'command = "python train.py"', "", "[profile]"]
    lines += [f"{k} = {v!r}".replace("'", '"') for k, v in d.items()]
    lines += ["", "[profile.train_defaults]"] + [f'{k} = "{v}"' for k, v in defaults.items()]
    return "\n".join(lines) + "\n"


def test_load_lab_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "nightlab.toml").write_text(_toml(PROFILES["cpu"]))
    assert load_lab_profile(tmp_path) == PROFILES["cpu"]
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    assert load_lab_profile() == PROFILES["cpu"]


def test_load_lab_profile_errors(tmp_path: Path):
    with pytest.raises(NotALabError, match="nightlab init"):
        load_lab_profile(tmp_path)
    (tmp_path / "nightlab.toml").write_text('[target]\ncommand = "python train.py"\n')
    with pytest.raises(ConfigError, match=r"no \[profile\] table"):
        load_lab_profile(tmp_path)
    (tmp_path / "nightlab.toml").write_text("[profile\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_lab_profile(tmp_path)


def test_profiles_import_is_stdlib_only():
    code = "import sys, nightlab.harness.profiles; print(sorted(m for m in ('numpy', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
