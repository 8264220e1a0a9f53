"""Bad input: one clear line on stderr, exit code 2 (usage) or 1 (failed), ledger unchanged."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from labkit import commit, nightlab, wait_json


def state(lab: Path) -> tuple[str, str]:
    """What bad input must leave alone: every experiment as `results` shows it, and the git refs."""
    results = nightlab("results", "--all", "--json", cwd=lab).stdout
    refs = subprocess.run(["git", "for-each-ref"], cwd=lab, capture_output=True, text=True, check=True).stdout
    return results, refs


def one_error_line(proc) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_not_a_lab(tmp_path):
    proc = nightlab("status", cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert "nightlab init" in one_error_line(proc)


def test_broken_config_names_the_key(make_lab):
    lab = make_lab()
    nightlab("submit", "-m", "baseline", "--no-start", cwd=lab)
    before = state(lab)
    toml = lab / "nightlab.toml"
    good = toml.read_text()
    toml.write_text(good.replace("timeout = 600", 'timeout = "ten minutes"'))
    proc = nightlab("results", cwd=lab, check=False)
    assert proc.returncode == 2 and "`target.timeout`" in one_error_line(proc)
    toml.write_text(good + "\n[[[broken\n")
    proc = nightlab("results", cwd=lab, check=False)
    assert proc.returncode == 2 and "not valid TOML" in one_error_line(proc)
    proc = nightlab("submit", "-m", "with a broken config", "--set", "LR=0.03", cwd=lab, check=False)
    assert proc.returncode == 2 and "not valid TOML" in one_error_line(proc)
    toml.write_text(good)
    assert state(lab) == before


def test_unknown_experiment(make_lab):
    lab = make_lab()
    nightlab("submit", "-m", "baseline", "--no-start", cwd=lab)
    before = state(lab)
    for args in (("show", "e9999"), ("adopt", "e9999"), ("cancel", "e9999"), ("wait", "e9999")):
        proc = nightlab(*args, cwd=lab, check=False)
        assert proc.returncode == 2, args
        assert "`e9999`" in one_error_line(proc)
    assert state(lab) == before


def test_bad_set_leaves_the_ledger_unchanged(make_lab):
    lab = make_lab()
    nightlab("submit", "-m", "baseline", "--no-start", cwd=lab)
    before = state(lab)
    missing = nightlab("submit", "-m", "x", "--set", "LRR=0.1", cwd=lab, check=False)
    assert missing.returncode == 2 and "LR" in one_error_line(missing)
    not_literal = nightlab("submit", "-m", "x", "--set", "LR=os.getcwd()", cwd=lab, check=False)
    assert not_literal.returncode == 2
    one_error_line(not_literal)
    malformed = nightlab("submit", "-m", "x", "--set", "LR", cwd=lab, check=False)
    assert malformed.returncode == 2 and "NAME=VALUE" in one_error_line(malformed)
    assert state(lab) == before


def test_init_refuses_a_non_empty_directory_and_a_missing_target(tmp_path, target_repo):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    proc = nightlab("init", "full", "--target", str(target_repo), cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "not empty" in one_error_line(proc)
    proc = nightlab("init", "new", "--target", str(tmp_path / "nope"), cwd=tmp_path, check=False)
    assert proc.returncode == 2 and not (tmp_path / "new").exists()


def test_init_refuses_cpu_slots_that_submit_would_refuse(tmp_path, target_repo):
    cores = len(os.sched_getaffinity(0))
    args = ("init", "lab", "--target", str(target_repo), "--cpu-slots", str(cores + 2))
    proc = nightlab(*args, cwd=tmp_path, check=False)
    line = one_error_line(proc)
    assert proc.returncode == 2 and f"ask for {cores + 2} threads" in line
    assert f"pass `--cpu-slots {cores}` or fewer" in line and "`--oversubscribe`" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]  # nothing written
    nightlab(*args, "--oversubscribe", cwd=tmp_path)
    lab = tmp_path / "lab"
    try:  # accepted at init, so the fleet submit starts accepts it too
        nightlab("fleet", "start", cwd=lab)
    finally:
        nightlab("fleet", "stop", cwd=lab, check=False)


def test_a_snapshot_that_cannot_be_materialised(make_lab):
    lab = make_lab(slots=1)
    nightlab("fleet", "stop", cwd=lab, check=False)
    eid = json.loads(
        nightlab("submit", "-m", "x", "--set", "LR=0.05", "--no-start", "--json", cwd=lab).stdout
    )[0]["id"]
    # destroy the snapshot: drop its ref and prune the unreachable objects
    subprocess.run(["git", "update-ref", "-d", f"refs/nightlab/{eid}"], cwd=lab, check=True)
    subprocess.run(["git", "reflog", "expire", "--expire=now", "--all"], cwd=lab, check=True)
    subprocess.run(["git", "gc", "-q", "--prune=now"], cwd=lab, check=True)
    nightlab("fleet", "start", cwd=lab)
    [done] = wait_json(lab, eid)
    assert done["outcome"] == "invalid"
    shown = json.loads(nightlab("show", eid, "--json", cwd=lab).stdout)
    assert "cannot be materialised" in shown["detail"]
    text = nightlab("show", eid, cwd=lab)
    assert "diff unavailable" in text.stdout


def test_second_fleet_start_is_refused(make_lab):
    lab = make_lab()
    nightlab("fleet", "start", cwd=lab)
    proc = nightlab("fleet", "start", cwd=lab, check=False)
    assert proc.returncode == 1 and "already running" in one_error_line(proc)


def test_uncommitted_config_edits_are_not_in_force(make_lab):
    """The committed nightlab.toml rules: an agent's quiet edit cannot change how runs are judged."""
    lab = make_lab(slots=1)
    toml = lab / "nightlab.toml"
    toml.write_text(
        toml.read_text()
        .replace('name = "val_bpb"', 'name = "peak_vram_mb"')
        .replace("timeout = 600", "timeout = 6000")
    )
    proc = nightlab("submit", "-m", "x", "--set", "LR=0.02", "--json", cwd=lab)
    assert "uncommitted edits" in proc.stderr and "git commit nightlab.toml" in proc.stderr
    eid = json.loads(proc.stdout)[0]["id"]
    wait_json(lab, eid)
    res = json.loads(nightlab("results", "--json", cwd=lab).stdout)
    assert res["metric"] == "val_bpb" and res["experiments"][0]["val_bpb"] == 1.0
    commit(lab, "metric", "nightlab.toml")
    committed = nightlab("results", "--json", cwd=lab)
    assert json.loads(committed.stdout)["metric"] == "peak_vram_mb" and "uncommitted" not in committed.stderr
