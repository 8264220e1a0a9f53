"""Promotion across two CPU tiers: screen a wave on `cpu`, promote to `cpu2`, judge there only."""

from __future__ import annotations

import json

from labkit import commit, nightlab, wait_json

CPU2 = '[[fleet.pool]]\nbackend = "local"\ntier = "cpu2"\nslots = 1\n'


def test_screen_and_promote_top_k_with_rank_correlation(quick_lab):
    lab = quick_lab(slots=2, extra_pools=CPU2, sleep=0.05)
    nightlab("noise", "--repeats", "2", "--wait", cwd=lab)
    out = json.loads(nightlab("sweep", "LR=0.015,0.02,0.03,0.005", "-m", "screen", "--json", cwd=lab).stdout)
    wait_json(lab, *(e["id"] for e in out["experiments"]))
    # LR 0.005 loses on the screen: only the three winners are promoted, the best first
    proc = nightlab(
        "promote", "--wave", out["wave"], "--tier", "cpu2", "--top", "3", "--repeats", "2", "--json", cwd=lab
    )
    promo = json.loads(proc.stdout)
    by_lr = {e["params"]["LR"]: e["id"] for e in out["experiments"]}
    promoted = {e["id"] for e in promo["experiments"] if e["source"] == "promote"}
    incumbent = [e for e in promo["experiments"] if e["source"] == "remeasure"]
    assert len(promoted) == 6 and len(incumbent) == 2  # the incumbent is measured on cpu2 too
    wait_json(lab, *(e["id"] for e in promo["experiments"]))
    w = json.loads(nightlab("waves", promo["wave"], "--json", cwd=lab).stdout)
    report = w["promotion"]
    assert list(report["screen"]) == [by_lr["0.02"], by_lr["0.015"], by_lr["0.03"]]
    assert report["rank_correlation"] == 1.0
    assert sorted(report["kept"]) == sorted(report["screen"])
    cpu2 = [e for e in w["experiments"] if e["source"] == "promote"]
    assert {e["tier"] for e in cpu2} == {"cpu2"} and {e["verdict"] for e in cpu2} == {"keep"}
    text = nightlab("waves", promo["wave"], cwd=lab).stdout
    assert "rank correlation between tiers: +1.00" in text
    # results are never compared across tiers: the cpu2 runs' deltas are against cpu2's incumbent
    res = json.loads(nightlab("results", "--tier", "cpu2", "--json", cwd=lab).stdout)
    assert set(res["incumbent"]["tiers"]) == {"cpu2"}


def test_promote_refuses_unknown_tier_and_same_tier(quick_lab):
    lab = quick_lab(slots=1, extra_pools=CPU2)
    eid = json.loads(nightlab("submit", "-m", "x", "--set", "LR=0.02", "--json", cwd=lab).stdout)[0]["id"]
    proc = nightlab("promote", eid, "--tier", "h200", cwd=lab, check=False)
    assert proc.returncode == 2 and "`h200`" in proc.stderr and "cpu, cpu2" in proc.stderr
    proc = nightlab("promote", eid, "--tier", "cpu", cwd=lab, check=False)
    assert proc.returncode == 2 and "already ran on tier `cpu`" in proc.stderr
    one = json.loads(nightlab("promote", eid, "--tier", "cpu2", "--repeats", "1", "--json", cwd=lab).stdout)
    assert [e["seed"] for e in one["experiments"] if e["source"] == "promote"] == [0]


def test_search_screens_on_one_tier_and_judges_on_the_other(quick_lab):
    lab = quick_lab(slots=2, extra_pools=CPU2, sleep=0.05, noise=0.002)
    # successive halving with eta 2: of the wave's 2 screened runs, the better climbs to cpu2
    toml = lab / "nightlab.toml"
    toml.write_text(toml.read_text().replace("[search]\n", "[search]\neta = 2\n", 1))
    commit(lab, "eta 2")
    args = [
        "--strategy",
        "surface",
        "--space",
        "LR=log(0.005,0.08)",
        "--tier",
        "cpu2",
        "--screen-tier",
        "cpu",
    ]
    proc = nightlab("search", *args, "--top", "1", "--repeats", "2", "--waves", "1", "--json", cwd=lab)
    # the noise floor runs on cpu2 (the validation tier): the first wave on cpu keeps its 2 slots
    assert "no noise floor on tier cpu2" in proc.stderr
    [wave] = json.loads(proc.stdout)["waves"]
    assert wave["proposed"] == 2 and wave["adopted"] is not None
    w = json.loads(nightlab("waves", wave["wave"], "--json", cwd=lab).stdout)
    promotion = json.loads(nightlab("waves", w["search"]["promotion"], "--json", cwd=lab).stdout)
    assert {e["tier"] for e in w["experiments"]} == {"cpu"}
    assert {e["tier"] for e in promotion["experiments"] if e["source"] == "promote"} == {"cpu2"}
    # the screened wave says which candidate climbed and why the other did not
    decisions = w["spec"]["rungs"]
    assert sorted(bool(d["promoted"]) for d in decisions.values()) == [False, True]
    # (the wave re-measures the incumbent on cpu too: the rung has seen 2 or 3 snapshots)
    winner = next(d for d in decisions.values() if d["promoted"])
    loser = next(d for d in decisions.values() if not d["promoted"])
    assert winner["rank"] == 1 and loser["rank"] > loser["cutoff"] >= 1
