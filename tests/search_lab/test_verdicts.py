"""Verdicts against the noise floor with a synthetic target of known noise, and `nightlab noise`.

The incumbent (LR 0.01) runs seeds 0-2 for the noise floor (sigma 0.0047, 2 dof): LR 0.02 gains
0.91 (keep: on two runs, as a keep needs), LR 0.01001 (one run) gains 0.0076, 1.4 se, under the
t threshold 4.53 for 2 dof (within-noise), LR 0.0098 loses (discard).
"""

from __future__ import annotations

import json

from labkit import nightlab, wait_json
from nightlab.lab import Lab


def submit(lab, lr: str, repeats: int = 1) -> list[str]:
    """The ids of `repeats` runs of LR=lr (a keep needs two: `decide.MIN_RUNS_TO_KEEP`)."""
    out = nightlab(
        "submit", "-m", f"lr {lr}", "--set", f"LR={lr}", "--repeats", str(repeats), "--json", cwd=lab
    ).stdout
    return [e["id"] for e in json.loads(out)]


def submit_and_wait(lab, runs: dict[str, int]) -> tuple[dict[str, str], dict[str, str]]:
    """Submit `repeats` runs per LR, wait for all; (LR -> its first run's id, id -> verdict)."""
    submitted = {lr: submit(lab, lr, n) for lr, n in runs.items()}
    every = [i for ids in submitted.values() for i in ids]
    done = {d["id"]: d["verdict"] for d in wait_json(lab, *every)}
    return {lr: ids[0] for lr, ids in submitted.items()}, done


def test_real_gain_is_kept_and_gain_inside_the_noise_is_not(quick_lab):
    lab = quick_lab(slots=2)
    noise = json.loads(nightlab("noise", "--repeats", "3", "--wait", "--json", cwd=lab).stdout)
    sigma = noise["tiers"]["cpu"]["sigma"]
    assert abs(sigma - 0.004672) < 1e-5 and noise["tiers"]["cpu"]["dof"] == 2
    [snap] = noise["snapshots"]
    assert snap["n"] == 3 and abs(snap["mean"] - 1.918180) < 1e-5
    ids, done = submit_and_wait(lab, {"0.02": 2, "0.01001": 1, "0.0098": 1})
    assert done[ids["0.02"]] == "keep"
    assert done[ids["0.01001"]] == "within-noise"
    assert done[ids["0.0098"]] == "discard"
    # results points at repeats of the within-noise candidate; 6 more runs of it would settle it
    # (each adds a degree of freedom to the floor, so the t threshold falls as they come in)
    res = nightlab("results", cwd=lab)
    hint = next(line for line in res.stderr.splitlines() if ids["0.01001"] in line)
    assert "within noise" in hint and f"--from {ids['0.01001']} --repeats" in hint
    with Lab.open(lab) as opened:
        exp = opened.ledger.get(ids["0.01001"])
        decision = opened.judge().decision(exp.identity, "cpu")
    assert (decision.repeats_to_settle.candidate, decision.repeats_to_settle.incumbent) == (6, 0)


def test_noise_needs_two_repeats_and_a_known_tier(quick_lab):
    lab = quick_lab()
    proc = nightlab("noise", "--repeats", "1", cwd=lab, check=False)
    assert proc.returncode == 2
    proc = nightlab("noise", "--tier", "h200", cwd=lab, check=False)
    assert proc.returncode == 2 and "`h200`" in proc.stderr and "cpu" in proc.stderr
    shown = nightlab("noise", "--show", cwd=lab)
    assert "no noise floor yet" in shown.stderr


def test_a_candidate_judged_before_the_incumbent_gets_its_verdict_when_the_incumbent_ends(quick_lab):
    """The controller fills it in; no read command has to (the dashboard only reads)."""
    from nightlab.ledger import open_ledger

    lab = quick_lab(slots=1)
    early, again = submit(lab, "0.02", 2)
    done = wait_json(lab, early, again)
    assert [d["verdict"] for d in done] == [None, None]  # the incumbent has no run on the tier yet
    nightlab("noise", "--repeats", "3", "--wait", cwd=lab)
    with open_ledger(lab) as ledger:
        assert ledger.get(early).verdict == "keep"


def test_verdicts_say_what_they_were_judged_against_after_an_adoption(quick_lab):
    """Issue 21: "-0.041 discard" after an adoption is shown against which incumbent it was judged."""
    lab = quick_lab(slots=2)
    nightlab("noise", "--repeats", "3", "--wait", cwd=lab)
    ids, done = submit_and_wait(lab, {"0.02": 2, "0.015": 2, "0.01001": 1})
    assert done[ids["0.02"]] == "keep" and done[ids["0.015"]] == "keep"
    assert done[ids["0.01001"]] == "within-noise"
    res = json.loads(nightlab("results", "--all", "--json", cwd=lab).stdout)
    base = res["incumbent"]["tiers"]["cpu"]
    row = next(e for e in res["experiments"] if e["id"] == ids["0.015"])
    assert row["judged"]["mean"] == base["mean"] and row["judged"]["n"] == 3 and not row["earlier_incumbent"]

    # adopting the within-noise one (forced): its runs are the incumbent now, never a candidate
    nightlab("adopt", ids["0.01001"], "--force", cwd=lab)
    res = json.loads(nightlab("results", "--all", "--json", cwd=lab).stdout)
    rows = {e["id"]: e for e in res["experiments"]}
    assert rows[ids["0.01001"]]["incumbent"] and not rows[ids["0.01001"]]["earlier_incumbent"]
    kept = rows[ids["0.015"]]
    # judged against the old incumbent's figure, its delta is against today's
    assert kept["verdict"] == "keep" and kept["earlier_incumbent"] and kept["judged"]["mean"] == base["mean"]
    today = res["incumbent"]["tiers"]["cpu"]["mean"]
    assert abs(kept["delta"] - (kept["val_bpb"] - today)) < 1e-9
    text = nightlab("results", "--all", cwd=lab)
    line = next(x for x in text.stdout.splitlines() if x.startswith(ids["0.015"]))
    assert "keep (vs earlier incumbent)" in line
    assert "incumbent (was within-noise)" in next(
        x for x in text.stdout.splitlines() if x.startswith(ids["0.01001"])
    )
    assert "judged before today's incumbent" in text.stderr
    assert f"{ids['0.01001']} is within noise" not in text.stderr  # the incumbent is no candidate
