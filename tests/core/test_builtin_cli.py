"""`nightlab init` of the built-in target, and `prepare` / `tune` through the CLI."""

from __future__ import annotations

import json

from labkit import nightlab, wait_json


def test_init_builtin_cpu_profile_and_prepare(tmp_path, monkeypatch):
    monkeypatch.setenv("NIGHTLAB_DATA_DIR", str(tmp_path / "data"))
    nightlab("init", "lab", "--profile", "cpu", "--budget", "5", cwd=tmp_path)
    lab = tmp_path / "lab"
    toml = (lab / "nightlab.toml").read_text()
    assert "builtin = true" in toml and 'name = "cpu"' in toml and "budget_seconds = 5.0" in toml
    assert "timeout = 130" in toml  # 2 x budget + 2 minutes
    assert "DEPTH = 2" in (lab / "train.py").read_text()  # the profile's train defaults
    # a run before `prepare` fails with the fix in its detail, never with a number
    eid = json.loads(nightlab("submit", "-m", "too early", "--json", cwd=lab).stdout)[0]["id"]
    [done] = wait_json(lab, eid, timeout=120)
    assert done["outcome"].startswith("crash:") and done["val_bpb"] is None
    assert "nightlab prepare" in json.loads(nightlab("show", eid, "--json", cwd=lab).stdout)["detail"]
    nightlab("fleet", "stop", cwd=lab)
    out = json.loads(nightlab("prepare", "--json", cwd=lab).stdout)
    assert out["data_dir"].startswith(str(tmp_path / "data"))
    again = json.loads(nightlab("prepare", "--json", cwd=lab).stdout)
    assert again["fingerprint"] == out["fingerprint"]


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
