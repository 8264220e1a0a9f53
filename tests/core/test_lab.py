"""Snapshots, adoption and reports on a real lab."""

from __future__ import annotations

import json
import subprocess

from labkit import nightlab, wait_json


def git(lab, *args):
    return subprocess.run(["git", *args], cwd=lab, capture_output=True, text=True, check=True).stdout.strip()


def test_snapshot_takes_uncommitted_edits_without_touching_the_tree(make_lab):
    lab = make_lab()
    nightlab("fleet", "stop", cwd=lab, check=False)
    text = (lab / "train.py").read_text()
    (lab / "train.py").write_text(text.replace("LR = 0.01", "LR = 0.03"))
    status_before = git(lab, "status", "--porcelain")
    [e] = json.loads(nightlab("submit", "-m", "lr 0.03", "--no-start", "--json", cwd=lab).stdout)
    assert git(lab, "status", "--porcelain") == status_before
    assert git(lab, "rev-parse", f"refs/nightlab/{e['id']}") == e["snapshot"]
    assert git(lab, "rev-parse", f"{e['snapshot']}^") == git(lab, "rev-parse", "HEAD")
    assert "LR = 0.03" in git(lab, "show", f"{e['snapshot']}:train.py")


def test_adopt_commits_the_snapshot_and_report_writes_results_tsv(make_lab):
    lab = make_lab(slots=2)
    base = json.loads(nightlab("submit", "-m", "baseline", "--json", cwd=lab).stdout)[0]["id"]
    better = json.loads(nightlab("submit", "-m", "lr\t0.02", "--set", "LR=0.02", "--json", cwd=lab).stdout)[0]
    crash = json.loads(nightlab("submit", "-m", "crash", "--set", "MODE='crash'", "--json", cwd=lab).stdout)[
        0
    ]["id"]
    wait_json(lab, base, better["id"], crash)
    # uncommitted edits of the editable file block adoption
    (lab / "train.py").write_text((lab / "train.py").read_text() + "# scratch\n")
    blocked = nightlab("adopt", better["id"], cwd=lab, check=False)
    assert blocked.returncode == 2 and "git checkout -- train.py" in blocked.stderr
    git(lab, "checkout", "--", "train.py")
    not_ok = nightlab("adopt", crash, cwd=lab, check=False)
    assert not_ok.returncode == 2 and "crash:exception" in not_ok.stderr
    nightlab("adopt", better["id"], "--force", cwd=lab)  # within-noise without a noise floor: forced
    assert "LR = 0.02" in (lab / "train.py").read_text()
    assert git(lab, "rev-parse", "HEAD^{tree}") == git(lab, "rev-parse", f"{better['snapshot']}^{{tree}}")
    assert git(lab, "log", "-1", "--format=%s").startswith(f"adopt {better['id']}")
    res = json.loads(nightlab("results", "--json", cwd=lab).stdout)
    assert res["incumbent"]["tiers"]["cpu"]["mean"] == 1.0

    nightlab("report", "--wide", cwd=lab)
    rows = [line.split("\t") for line in (lab / "results.tsv").read_text().splitlines()]
    assert rows[0] == ["commit", "val_bpb", "memory_gb", "status", "description"]
    by_desc = {r[4]: r for r in rows[1:]}
    assert by_desc["baseline"][3] == "keep" and by_desc["baseline"][2] == "2.0"
    assert by_desc["lr 0.02"][3] == "keep" and by_desc["lr 0.02"][1] == "1.000000"
    assert by_desc["lr 0.02"][0] == better["snapshot"][:7]
    assert by_desc["crash"][1:4] == ["0.000000", "0.0", "crash"]
    wide = (lab / "results-wide.tsv").read_text().splitlines()
    assert "tier" in wide[0].split("\t") and "training_seconds" in wide[0].split("\t")
    assert (lab / "progress.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
