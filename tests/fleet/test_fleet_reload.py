"""The running controller takes up committed pool changes without stopping running work (issue 21)."""

from __future__ import annotations

import json

from labkit import commit, nightlab, wait_json, wait_until

CPU2 = '\n[[fleet.pool]]\nbackend = "local"\ntier = "cpu2"\nslots = 1\n'
CPU3 = '\n[[fleet.pool]]\nbackend = "local"\ntier = "cpu3"\nslots = 1\n'


def _add_pool(lab, pool: str, *, oversubscribe: bool) -> None:
    toml = lab / "nightlab.toml"
    text = toml.read_text().replace("oversubscribe = true\n", "")
    if oversubscribe:
        text = text.replace("[fleet]\n", "[fleet]\noversubscribe = true\n")
    toml.write_text(text.replace("\n[search]", pool + "\n[search]"))
    commit(lab, "pool change")


def test_new_pool_is_taken_up_while_work_runs_and_a_refused_one_is_named(make_lab, tmp_path):
    lab = make_lab(slots=1)
    # the long run waits for `gate`, opened once the new pool's run has ended: it is still running
    # then however long the reload takes (a 6 s sleep ended first at load 20)
    gate = tmp_path / "gate"
    long_knobs = ("--set", "SLEEP=0.5", "--set", f"GATE={str(gate)!r}")
    [long] = json.loads(nightlab("submit", "-m", "long", *long_knobs, "--json", cwd=lab).stdout)
    wait_until(lambda: json.loads(nightlab("status", "--json", cwd=lab).stdout)["running"], timeout=30)
    # a tier nightlab.toml does not have is refused with the fix
    refused = nightlab("submit", "-m", "x", "--tier", "cpu2", cwd=lab, check=False)
    assert refused.returncode == 2 and 'add a [[fleet.pool]] with tier = "cpu2"' in refused.stderr
    _add_pool(lab, CPU2, oversubscribe=True)
    [quick] = json.loads(nightlab("submit", "-m", "on cpu2", "--tier", "cpu2", "--json", cwd=lab).stdout)
    [done] = wait_json(lab, quick["id"], timeout=60)
    assert done["outcome"] == "ok"
    shown = json.loads(nightlab("show", quick["id"], "--json", "--no-diff", cwd=lab).stdout)
    assert shown["attempts"][0]["worker"] == "cpu2-0"
    gate.touch()
    wait_json(lab, long["id"], timeout=60)
    ended = json.loads(nightlab("show", long["id"], "--json", "--no-diff", cwd=lab).stdout)
    assert ended["outcome"] == "ok" and len(ended["attempts"]) == 1  # never killed nor requeued
    assert shown["attempts"][0]["started_at"] < ended["attempts"][0]["ended_at"]  # ran beside it
    # a pool change that would oversubscribe the machine is not taken up; submit says why
    _add_pool(lab, CPU3, oversubscribe=False)
    refused = nightlab("submit", "-m", "x", "--tier", "cpu3", cwd=lab, check=False)
    assert refused.returncode == 2, refused.stderr
    line = refused.stderr.strip().splitlines()[-1]
    assert "has no worker of tier `cpu3`" in line and "oversubscribe = true" in line
