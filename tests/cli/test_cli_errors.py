"""Bad input: one clear line on stderr, exit code 2 (usage) or 1 (failed), ledger unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    """A broken committed nightlab.toml stops every command with one line naming the key; a
    broken working copy (an edit half done) stops none: the committed file is in force and
    each command warns once, naming the key or the line."""
    lab = make_lab()
    nightlab("submit", "-m", "baseline", "--no-start", cwd=lab)
    toml = lab / "nightlab.toml"
    good = toml.read_text()
    toml.write_text(good.replace("timeout = 600", 'timeout = "ten minutes"'))
    proc = nightlab("results", "--all", cwd=lab)
    assert "e0001" in proc.stdout
    [warning] = [line for line in proc.stderr.splitlines() if "nightlab.toml" in line]
    assert warning.startswith("warning: the uncommitted nightlab.toml is broken and ignored")
    assert "`target.timeout`" in warning and "git checkout nightlab.toml" in warning
    toml.write_text(good + "\n[fleet\n")
    lines = good.count("\n") + 2  # the appended line
    for args in (("results", "--all"), ("status",), ("show", "e0001")):
        proc = nightlab(*args, cwd=lab)
        assert "e0001" in proc.stdout
        [warning] = [line for line in proc.stderr.splitlines() if "nightlab.toml" in line]
        assert "not valid TOML" in warning and f"line {lines}," in warning, warning
    commit(lab, "break it", "nightlab.toml")
    before = state_of_refs(lab)
    proc = nightlab("results", cwd=lab, check=False)
    assert proc.returncode == 2 and "not valid TOML" in one_error_line(proc)
    proc = nightlab("submit", "-m", "with a broken config", "--set", "LR=0.03", cwd=lab, check=False)
    assert proc.returncode == 2 and "not valid TOML" in one_error_line(proc)
    assert state_of_refs(lab) == before
    toml.write_text(good)
    commit(lab, "mend it", "nightlab.toml")
    assert "e0001" in nightlab("results", "--all", cwd=lab).stdout


def state_of_refs(lab: Path) -> str:
    return subprocess.run(["git", "for-each-ref"], cwd=lab, capture_output=True, text=True, check=True).stdout


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


def test_a_second_fleet_start_says_it_runs_and_does_nothing(make_lab):
    lab = make_lab()
    first = nightlab("fleet", "start", cwd=lab)
    pid = int(first.stdout)
    again = nightlab("fleet", "start", cwd=lab)
    assert int(again.stdout) == pid
    assert again.stderr.startswith(f"controller already running (pid {pid}); nothing to do"), again.stderr


def test_two_fleet_starts_at_once_make_one_controller_and_both_name_its_pid(make_lab):
    """Both used to see "none runs": the loser printed `already running (pid -1)` and exited 1."""
    lab = make_lab()
    starts = [
        subprocess.Popen(
            [sys.executable, "-m", "nightlab", "fleet", "start"],
            cwd=lab,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in starts]
    assert [p.returncode for p in starts] == [0, 0], outs
    pids = {int(out) for out, _ in outs}
    assert len(pids) == 1 and pids.pop() > 0, outs
    said = sorted(err.split(" (pid")[0] for _, err in outs)
    assert said == ["controller already running", "controller started"], outs


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


def test_ctrl_c_on_wait_says_what_goes_on_and_how_to_wait_again(make_lab, monkeypatch, capsys):
    """It used to print only `aborted`."""
    import pytest

    from nightlab.cli import main
    from nightlab.lab import Lab

    lab = make_lab()
    nightlab("submit", "-m", "x", "--no-start", cwd=lab)
    nightlab("submit", "-m", "y", "--set", "LR=0.03", "--no-start", cwd=lab)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # what SIGINT raises in the wait loop's sleep

    monkeypatch.setattr(Lab, "wait", interrupted)
    monkeypatch.setenv("NIGHTLAB_DIR", str(lab))
    for args, again in (
        (["wait", "e0002"], "nightlab wait e0002"),
        (["wait", "--all"], "nightlab wait --all"),
        (["wait", "--any"], "nightlab wait --any"),
    ):
        with pytest.raises(SystemExit) as ended:
            main(args)
        assert ended.value.code == 130
        err = capsys.readouterr().err.strip()
        assert err.startswith("wait interrupted; still going on the fleet: ") and "aborted" not in err
        assert "e0002 (queued)" in err and err.endswith(f"wait again with `{again}`"), err


def test_show_says_when_the_log_is_missing(make_lab):
    lab = make_lab(slots=1)
    [eid] = [e["id"] for e in json.loads(nightlab("submit", "-m", "x", "--json", cwd=lab).stdout)]
    wait_json(lab, eid)
    shown = json.loads(nightlab("show", eid, "--json", cwd=lab).stdout)
    assert not shown["log_missing"] and shown["log_tail"]
    log = Path(shown["log_path"])
    log.unlink()
    text = nightlab("show", eid, cwd=lab).stdout
    assert f"log: missing (expected at {log};" in text
    assert json.loads(nightlab("show", eid, "--json", cwd=lab).stdout)["log_missing"]
