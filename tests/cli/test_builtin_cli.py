"""`nightlab init` of the built-in target, and `prepare` / `tune` through the CLI."""

from __future__ import annotations

import json

from labkit import nightlab


def test_init_builtin_cpu_profile_and_prepare(tmp_path, monkeypatch):
    monkeypatch.setenv("NIGHTLAB_DATA_DIR", str(tmp_path / "data"))
    init = nightlab("init", "lab", "--profile", "cpu", "--budget", "5", cwd=tmp_path)
    assert "next: cd lab && nightlab prepare && nightlab submit" in init.stderr  # the data comes first
    lab = tmp_path / "lab"
    toml = (lab / "nightlab.toml").read_text()
    assert "builtin = true" in toml and 'name = "cpu"' in toml and "budget_seconds = 5.0" in toml
    assert "timeout = 130" in toml  # 2 x budget + 2 minutes
    assert "DEPTH = 2" in (lab / "train.py").read_text()  # the profile's train defaults
    # a run before `prepare` is refused with the command to run; it would only crash and burn a slot
    early = nightlab("submit", "-m", "too early", cwd=lab, check=False)
    assert early.returncode == 2 and "run `nightlab prepare` in the lab first" in early.stderr
    assert json.loads(nightlab("results", "--all", "--json", cwd=lab).stdout)["experiments"] == []
    assert not (lab / ".nightlab" / "controller.pid").exists()
    out = json.loads(nightlab("prepare", "--json", cwd=lab).stdout)
    assert out["data_dir"].startswith(str(tmp_path / "data"))
    again = json.loads(nightlab("prepare", "--json", cwd=lab).stdout)
    assert again["fingerprint"] == out["fingerprint"]
    queued = json.loads(nightlab("submit", "-m", "now", "--no-start", "--json", cwd=lab).stdout)
    assert queued[0]["id"] == "e0001"


def test_prepare_and_tune_refuse_a_foreign_target(make_lab):
    lab = make_lab()
    for command in ("prepare", "tune"):
        proc = nightlab(command, cwd=lab, check=False)
        assert proc.returncode == 2
        assert "foreign target" in proc.stderr


def test_profile_flags_need_the_builtin_target(tmp_path, target_repo):
    proc = nightlab(
        "init", "lab", "--target", str(target_repo), "--profile", "cpu", cwd=tmp_path, check=False
    )
    assert proc.returncode == 2 and "built-in target only" in proc.stderr
    proc = nightlab("init", "lab2", "--profile", "tpu9000", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "cpu" in proc.stderr
    assert not (tmp_path / "lab2").exists()
