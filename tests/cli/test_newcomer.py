"""What a newcomer trips over, through the real CLI (issue 22): typed `--set`, messages that name
the real problem, `wait --json` on a timeout, `status` time left, `waves` counts, readable figures,
per-tier results files and a clean `git status` after a report.

Run: .venv/bin/python -m pytest -q tests/cli/test_newcomer.py
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from labkit import commit, nightlab, wait_json, wait_until

CPU2 = '[[fleet.pool]]\nbackend = "local"\ntier = "cpu2"\nslots = 1\n'


def results(lab: Path) -> list[dict]:
    return json.loads(nightlab("results", "--all", "--json", cwd=lab).stdout)["experiments"]


def test_set_is_checked_against_the_knob_type_and_given_once(make_lab):
    lab = make_lab()
    wrong = nightlab("submit", "-m", "x", "--set", "MODE=1", cwd=lab, check=False)
    assert wrong.returncode == 2
    assert '`MODE=1`: knob `MODE` is str `"ok"`, not int; give a quoted string' in wrong.stderr
    twice = nightlab("submit", "-m", "x", "--set", "LR=0.02", "--set", "LR=0.03", cwd=lab, check=False)
    assert twice.returncode == 2
    assert "`--set LR` is given twice (`0.02` and `0.03`); give each knob once" in twice.stderr
    typo = nightlab("submit", "-m", "x", "--set", "LRR=0.1", cwd=lab, check=False)
    assert "did you mean `LR`?" in typo.stderr
    tier = nightlab("submit", "-m", "x", "--tier", "cpuu", cwd=lab, check=False)
    assert tier.returncode == 2 and "no workers of tier `cpuu`; did you mean `cpu`?" in tier.stderr
    assert results(lab) == []


def test_a_duplicate_names_the_queued_run_and_wait_json_prints_state_on_timeout(make_lab):
    lab = make_lab()
    nightlab("submit", "-m", "baseline", "--no-start", cwd=lab)
    dup = nightlab("submit", "-m", "again", "--no-start", cwd=lab, check=False)
    assert dup.returncode != 0
    assert "are already queued as e0001 (`baseline`); wait for it with `nightlab wait e0001`" in dup.stderr
    timed_out = nightlab("wait", "e0001", "--timeout", "0.3", "--json", cwd=lab, check=False)
    assert timed_out.returncode == 1 and "timed out" in timed_out.stderr
    [row] = json.loads(timed_out.stdout)
    assert row["id"] == "e0001" and row["status"] == "queued" and row["outcome"] is None


def test_waves_count_cancelled_runs_apart_from_failures(make_lab):
    lab = make_lab(slots=1)
    # the incumbent's point (SLEEP 0.2) runs first; the two long ones are cancelled
    sweep = json.loads(nightlab("sweep", "SLEEP=0.2,30,31", "-m", "three", "--json", cwd=lab).stdout)
    first, *rest = (e["id"] for e in sweep["experiments"])
    nightlab("cancel", *rest, cwd=lab)  # queued or running: cancelled either way
    wait_json(lab, first, *rest)
    [wave] = json.loads(nightlab("waves", "--json", cwd=lab).stdout)
    n = len(rest)
    assert (wave["finished"], wave["crashed"], wave["cancelled"], wave["pending"]) == (1, 0, n, 0)
    header, row = nightlab("waves", cwd=lab).stdout.splitlines()
    assert header.split()[3:7] == ["ok", "fail", "canc", "pend"] and row.split()[3:7] == [
        "1",
        "0",
        str(n),
        "0",
    ]
    assert f"1 ok, 0 failed, {n} cancelled, 0 pending" in nightlab("waves", wave["id"], cwd=lab).stdout


def test_status_shows_the_expected_end_and_the_hard_limit_apart(make_lab):
    lab = make_lab(slots=1, timeout=120)
    [ok] = wait_json(lab, json.loads(nightlab("submit", "-m", "quick", "--json", cwd=lab).stdout)[0]["id"])
    assert ok["outcome"] == "ok"
    [long] = json.loads(nightlab("submit", "-m", "long", "--set", "SLEEP=30", "--json", cwd=lab).stdout)

    def running():
        state = json.loads(nightlab("status", "--json", cwd=lab).stdout)
        return state["running"] and state

    state = wait_until(running, timeout=30)
    [run] = state["running"]
    quick = json.loads(nightlab("show", ok["id"], "--json", cwd=lab).stdout)
    wall = quick["finished_at"] - quick["started_at"]
    assert run["expected"] == wall  # the tier's ok runs say how long a run takes, not the timeout
    assert run["timeout"] == 120
    assert (
        run["remaining"] == run["expected"] - run["elapsed"]
        or abs(run["remaining"] - (run["expected"] - run["elapsed"])) < 1
    )
    text = nightlab("status", cwd=lab).stdout
    assert "(hard limit in " in text and "long" in text
    nightlab("cancel", long["id"], cwd=lab)


def test_figures_read_as_integers_and_generated_files_stay_out_of_git(make_lab):
    lab = make_lab(extra_pools=CPU2)
    train = lab / "train.py"
    train.write_text(
        train.read_text()
        + 'STEPS = (1,\n         2,\n         3,\n         "a long tail that goes on and on")\n'
    )
    commit(lab, "a multi-line knob")
    a = json.loads(nightlab("submit", "-m", "cpu run", "--json", cwd=lab).stdout)[0]["id"]
    b = json.loads(nightlab("submit", "-m", "cpu2 run", "--tier", "cpu2", "--json", cwd=lab).stdout)[0]["id"]
    wait_json(lab, a, b)
    show = nightlab("show", a, "--no-diff", "--tail", "0", cwd=lab).stdout
    assert "  env_seed: 0\n" in show  # stored as 0.0: an integer prints as one
    assert "  training_seconds: 0.2\n" in show and "  val_bpb: 1." in show
    assert "log tail" not in show  # `--tail 0`: no log lines at all
    assert len(next(line for line in show.splitlines() if "val_bpb" in line).split(".")[1]) == 6
    # one multi-line tuple does not widen the knobs table; --json keeps the full source
    rows = nightlab("knobs", cwd=lab).stdout.splitlines()
    assert max(len(r.rstrip()) for r in rows) <= 80
    assert any(r.startswith("STEPS") and "…" in r for r in rows)
    full = next(k for k in json.loads(nightlab("knobs", "--json", cwd=lab).stdout) if k["name"] == "STEPS")
    assert "on and on" in full["source"]
    # results.tsv holds the default tier, each other tier its own file of the same shape
    files = json.loads(nightlab("report", "--wide", "--json", cwd=lab).stdout)["files"]
    assert {Path(f).name for f in files} >= {"results.tsv", "results-cpu2.tsv", "results-wide.tsv"}
    main = (lab / "results.tsv").read_text().splitlines()
    other = (lab / "results-cpu2.tsv").read_text().splitlines()
    assert main[0] == other[0] == "commit\tval_bpb\tmemory_gb\tstatus\tdescription"
    assert [r.split("\t")[4] for r in main[1:]] == ["cpu run"]
    assert [r.split("\t")[4] for r in other[1:]] == ["cpu2 run"]
    wide = (lab / "results-wide.tsv").read_text().splitlines()
    header = wide[0].split("\t")
    assert wide[1].split("\t")[header.index("env_seed")] == "0"
    # the report's files are git-ignored: the user's `git status` stays clean
    status = subprocess.run(["git", "status", "--porcelain"], cwd=lab, capture_output=True, text=True).stdout
    assert status == ""


def test_the_cli_reference_lists_each_command_once():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    headings = [line for line in doc.splitlines() if line.startswith("#")]
    assert len(headings) == len(set(headings))
    agent = doc.split("### `nightlab agent`")[1].split("#### ")[0]
    assert sum(1 for line in agent.splitlines() if line.strip().startswith("status ")) == 1
