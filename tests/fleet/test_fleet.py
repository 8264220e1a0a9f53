"""The local fleet end to end through the real CLI: dispatch, failure classes, timeouts,
retries, cancellation, tiers, recovery after SIGKILL of the controller, concurrent submits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from labkit import nightlab, wait_json, wait_until


def submit(lab: Path, message: str, *sets: str, extra: tuple[str, ...] = ()) -> str:
    args = ["submit", "-m", message, "--json", *extra]
    for s in sets:
        args += ["--set", s]
    return json.loads(nightlab(*args, cwd=lab).stdout)[0]["id"]


def show(lab: Path, eid: str) -> dict:
    return json.loads(nightlab("show", eid, "--json", cwd=lab).stdout)


def test_submit_runs_and_results_sort_by_metric(make_lab):
    lab = make_lab(slots=2)
    base = submit(lab, "baseline")
    better = submit(lab, "lr 0.02", "LR=0.02")
    worse = submit(lab, "lr 0.2", "LR=0.2")
    done = wait_json(lab, base, better, worse)
    assert {d["outcome"] for d in done} == {"ok"}
    res = json.loads(nightlab("results", "--json", cwd=lab).stdout)
    ids = [e["id"] for e in res["experiments"]]
    assert ids == [better, base, worse]
    rows = {e["id"]: e for e in res["experiments"]}
    assert rows[base]["delta"] == 0 and rows[base]["verdict"] == "baseline"
    assert rows[better]["delta"] < 0 < rows[worse]["delta"]
    # the working tree was never touched by --set
    assert "LR = 0.01" in (lab / "train.py").read_text()
    data = show(lab, better)
    assert "-LR = 0.01" in data["diff"] and "+LR = 0.02" in data["diff"]
    assert data["metrics"]["peak_vram_mb"] > 2048
    # the environment carried the experiment's identity
    state = json.loads(nightlab("fleet", "status", "--json", cwd=lab).stdout)
    assert state["controller"]["running"] and state["controller"]["pid"] > 0
    assert [w["name"] for w in state["workers"]] == ["cpu-0", "cpu-1"]


def test_every_failure_class(make_lab, tmp_path):
    lab = make_lab(slots=2)
    modes = {
        "crash": "crash:exception",
        "oom": "crash:oom",
        "nan": "crash:nan",
        "garbage": "crash:no-summary",
        "nothing": "crash:no-summary",
        "partial": "crash:no-summary",
        "exit3": "crash:exception",
        "selfkill": "crash:exception",
    }
    ids = {submit(lab, f"mode {m}", f"MODE='{m}'"): expected for m, expected in modes.items()}
    # a syntax error in the working tree, snapshotted as it is
    original = (lab / "train.py").read_text()
    (lab / "train.py").write_text(original + "\ndef broken(:\n")
    ids[submit(lab, "syntax error")] = "crash:syntax"
    (lab / "train.py").write_text(original)
    done = {d["id"]: d for d in wait_json(lab, *ids)}
    assert {i: done[i]["outcome"] for i in ids} == ids
    crash = show(lab, next(i for i, o in ids.items() if o == "crash:exception"))
    assert crash["detail"] == "ValueError: boom at step 3"
    assert any("ValueError: boom at step 3" in line for line in crash["log_tail"])
    assert crash["attempts"][0]["exit_code"] == 1
    # crashes are not retried
    assert all(show(lab, i)["attempts"].__len__() == 1 for i in ids)


def test_timeout_kills_the_whole_process_group(make_lab):
    lab = make_lab(slots=1, timeout=2)
    eid = submit(lab, "hangs", "MODE='hang'")
    [done] = wait_json(lab, eid, timeout=30)
    assert done["outcome"] == "timeout"
    marker = str(lab / ".nightlab" / "runs" / eid)
    survivors = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert survivors == []


def test_huge_log_is_trimmed_and_still_parsed(make_lab):
    lab = make_lab(slots=1)
    eid = submit(lab, "chatty", "MODE='big'", "SLEEP=0")
    [done] = wait_json(lab, eid, timeout=60)
    assert done["outcome"] == "ok"
    log = Path(show(lab, eid)["log_path"])
    assert log.stat().st_size < 9 * 1024 * 1024


def test_infra_failure_is_retried_on_a_new_attempt(make_lab):
    lab = make_lab(slots=1)
    eid = submit(lab, "slow", "SLEEP=1.5")
    run_dir = lab / ".nightlab" / "runs" / eid / "attempt-1"
    wait_until(lambda: (run_dir / "run.sh").exists())
    time.sleep(0.3)
    out = subprocess.run(
        ["pgrep", "-f", str(run_dir / "run.sh")], capture_output=True, text=True
    ).stdout.split()
    assert out, "the first attempt should be running"
    os.killpg(int(out[0]), signal.SIGKILL)  # the worker dies from outside
    [done] = wait_json(lab, eid, timeout=30)
    assert done["outcome"] == "ok"
    attempts = show(lab, eid)["attempts"]
    assert [a["failure"] for a in attempts] == ["infra", "ok"]


def test_cancel_queued_and_running(make_lab):
    lab = make_lab(slots=1)
    running = submit(lab, "long", "SLEEP=30")
    queued = submit(lab, "later", "LR=0.03")
    wait_until(lambda: json.loads(nightlab("status", "--json", cwd=lab).stdout)["running"])
    out = json.loads(nightlab("cancel", running, queued, "--json", cwd=lab).stdout)
    assert out == {running: "cancelling", queued: "cancelled"}
    done = {d["id"]: d for d in wait_json(lab, running, queued, timeout=20)}
    assert done[running]["status"] == "cancelled" and done[queued]["status"] == "cancelled"


def test_priority_and_tiers(make_lab):
    lab = make_lab(slots=1, extra_pools='[[fleet.pool]]\nbackend = "local"\ntier = "cpu2"\nslots = 1\n')
    nightlab("fleet", "stop", cwd=lab, check=False)
    first = submit(lab, "first", "LR=0.03", extra=("--no-start",))
    urgent = submit(lab, "urgent", "LR=0.04", extra=("--no-start", "--priority", "5"))
    other = submit(lab, "other tier", "LR=0.05", extra=("--no-start", "--tier", "cpu2"))
    nightlab("fleet", "start", cwd=lab)
    wait_json(lab, first, urgent, other)
    starts = {i: show(lab, i)["attempts"][0] for i in (first, urgent, other)}
    assert starts[urgent]["started_at"] <= starts[first]["started_at"]
    assert starts[other]["worker"] == "cpu2-0"
    bad = nightlab("submit", "-m", "x", "--tier", "h100", cwd=lab, check=False)
    assert bad.returncode == 2 and "cpu, cpu2" in bad.stderr


def test_repeats_seeds_and_duplicates(make_lab):
    lab = make_lab(slots=2)
    first = submit(lab, "baseline")
    dup = nightlab("submit", "-m", "again", cwd=lab, check=False)
    assert dup.returncode == 2
    assert first in dup.stderr and "--seed" in dup.stderr and "--repeats" in dup.stderr
    reps = json.loads(nightlab("submit", "-m", "noise", "--repeats", "3", "--json", cwd=lab).stdout)
    assert sorted(r["seed"] for r in reps) == [1, 2, 3]
    forced = json.loads(nightlab("submit", "-m", "forced", "--force", "--json", cwd=lab).stdout)
    assert forced[0]["seed"] == 0
    wait_json(lab, first, *(r["id"] for r in reps), forced[0]["id"])
    for rep in reps:  # the run itself saw its seed (the target prints NIGHTLAB_SEED back)
        assert show(lab, rep["id"])["metrics"]["env_seed"] == rep["seed"]


def test_fresh_seeds_skip_the_ones_already_used(make_lab):
    """A single re-measurement (settle, promote, re-measure the incumbent) takes the lowest unused seed."""
    from nightlab.lab import Lab

    lab = make_lab(slots=1)
    with Lab.open(lab) as opened:
        [first] = opened.submit("baseline", start_controller=False)
        [again] = opened.submit("re-measure", fresh_seeds=True, start_controller=False)
        two = opened.submit("two more", repeats=2, fresh_seeds=True, start_controller=False)
    assert (first.seed, again.seed, [e.seed for e in two]) == (0, 1, [2, 3])


def test_twenty_concurrent_submits(make_lab):
    lab = make_lab(slots=1)
    nightlab("fleet", "stop", cwd=lab, check=False)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nightlab",
                "submit",
                "-m",
                f"idea {i}",
                "--set",
                f"LR={0.001 * (i + 1)}",
                "--no-start",
                "--json",
            ],
            cwd=lab,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(20)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    ids = [json.loads(o[0])[0]["id"] for o in outs]
    assert len(set(ids)) == 20
    res = json.loads(nightlab("results", "--all", "--json", cwd=lab).stdout)
    assert len(res["experiments"]) == 20
    refs = subprocess.run(
        ["git", "for-each-ref", "refs/nightlab/"], cwd=lab, capture_output=True, text=True
    ).stdout
    assert len(refs.splitlines()) == 20


def test_sigkill_of_the_controller_mid_wave(make_lab):
    """Every experiment ends exactly once: running ones are re-attached, nothing runs twice."""
    lab = make_lab(slots=2)
    nightlab("fleet", "stop", cwd=lab, check=False)
    ids = [
        submit(lab, f"idea {i}", f"LR={0.005 * (i + 1)}", "SLEEP=1.0", extra=("--no-start",))
        for i in range(6)
    ]
    pid = int(nightlab("fleet", "start", cwd=lab).stdout.strip())
    wait_until(
        lambda: len(json.loads(nightlab("status", "--json", cwd=lab).stdout)["running"]) == 2, timeout=30
    )
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.3)
    # no stale lock: a new controller starts at once
    nightlab("fleet", "start", cwd=lab)
    done = wait_json(lab, *ids, timeout=60)
    assert [d["outcome"] for d in done] == ["ok"] * 6
    for eid in ids:
        data = show(lab, eid)
        assert len(data["attempts"]) == 1, data["attempts"]  # re-attached, not re-run
    from nightlab.ledger import open_ledger

    with open_ledger(lab) as ledger:
        ends = [e for e in ledger.events() if e.kind == "end"]
        reattached = {e.experiment_id for e in ledger.events() if e.kind == "reattach"}
    assert sorted(e.experiment_id for e in ends) == sorted(ids)
    assert len(reattached) == 2


def test_runs_get_their_identity_and_never_the_measurement_overrides(make_lab):
    lab = make_lab(slots=1)
    nightlab("fleet", "stop", cwd=lab, check=False)
    eid = submit(lab, "env", extra=("--no-start",))
    loosened = {"NIGHTLAB_HANDIN_GRACE": "999", "NIGHTLAB_WALL_ALLOWANCE": "9999"}
    nightlab("fleet", "start", cwd=lab, env={"NIGHTLAB_BUDGET": "9999", **loosened})
    wait_json(lab, eid)
    metrics = show(lab, eid)["metrics"]
    assert metrics["env_experiment"] == eid
    assert metrics["env_tier"] == "cpu"
    assert metrics["env_budget"] == "none"
    assert metrics["env_loosened"] == 0  # the supervisor's test-only widenings never reach a run
