"""`nightlab effects` against a target whose metric is a known linear model of coded knob levels."""

from __future__ import annotations

import json

from labkit import commit, nightlab, wait_json

# val_bpb = 2 + 0.30 a - 0.20 b + 0.05 c + 0.10 a b (+ seeded noise), a = 2 A - 1 etc.
EFFECTS_TRAIN = """\
import math
import os
import time

A = 0  # coded a = 2 A - 1
B = 0
C = 0
SLEEP = 0.0  # seconds
CRASH = 0  # > 0: fail before the summary
NOISE = 0.001

seed = int(os.environ.get("NIGHTLAB_SEED", "0"))
time.sleep(SLEEP)
if CRASH:
    raise SystemExit("boom")
a, b, c = (2 * k - 1 for k in (A, B, C))
value = 2.0 + 0.30 * a - 0.20 * b + 0.05 * c + 0.10 * a * b + NOISE * math.sin(12.9898 * (seed + 1))
print("---")
print(f"val_bpb: {value:.6f}")
"""


def effects_lab(make_lab, slots: int):
    lab = make_lab(slots=slots)
    (lab / "train.py").write_text(EFFECTS_TRAIN)
    commit(lab, "effects target")
    return lab


def sweep(lab, *args: str) -> dict:
    return json.loads(nightlab("sweep", *args, "--json", cwd=lab).stdout)


def test_effects_match_the_known_coefficients(make_lab, cli_inprocess):
    lab = effects_lab(make_lab, 2)
    out = sweep(lab, "A=0,1", "B=0,1", "C=0,1", "-m", "abc")
    wait_json(lab, *(e["id"] for e in out["experiments"]))
    code, stdout, _ = cli_inprocess(lab, "effects", out["wave"], "--json")
    res = json.loads(stdout)
    coef = {t["term"]: t for t in res["terms"]}
    truth = {"A": 0.30, "B": -0.20, "C": 0.05, "A:B": 0.10, "A:C": 0.0, "B:C": 0.0}
    for term, value in truth.items():
        assert abs(coef[term]["coefficient"] - value) < 0.002, (term, coef[term])
        assert 0 < coef[term]["std_error"] < 0.003
    assert abs(coef["A"]["effect"] - 0.60) < 0.004
    assert (res["runs"], res["pending"], res["crashed"], res["residual_dof"]) == (8, 0, 0, 1)
    assert res["predicted_best"] == {"A": "0", "B": "1", "C": "0"}
    assert abs(res["predicted_val_bpb"] - 1.35) < 0.003
    assert res["plot"].endswith(f"{out['wave']}.png") and (lab / ".nightlab" / "effects").is_dir()
    code, text, _ = cli_inprocess(lab, "effects", out["wave"])
    assert code == 0 and "predicted best: A=0 B=1 C=0" in text and "A:B" in text


def test_partial_crashed_and_factorless_waves(make_lab, cli_inprocess):
    lab = effects_lab(make_lab, 4)
    # a fraction of 4 factors at resolution IV: main effects clear of two-way interactions
    frac = sweep(lab, "A=0,1", "B=0,1", "C=0,1", "SLEEP=0,0.05", "--design", "fractional", "-m", "frac")
    wait_json(lab, *(e["id"] for e in frac["experiments"]))
    res = json.loads(cli_inprocess(lab, "effects", frac["wave"], "--json")[1])
    coef = {t["term"]: t["coefficient"] for t in res["terms"]}
    assert abs(coef["A"] - 0.30) < 0.002 and abs(coef["B"] + 0.20) < 0.002 and abs(coef["SLEEP"]) < 0.002
    # a wave still running: a partial result that says how many runs are pending
    slow = sweep(lab, "A=0,1", "SLEEP=0,30", "-m", "slow")
    fast = [e["id"] for e in slow["experiments"] if e["params"].get("SLEEP") == "0"]
    wait_json(lab, *fast)
    res = json.loads(cli_inprocess(lab, "effects", slow["wave"], "--json")[1])
    assert res["pending"] == 2 and "2 still running (partial result)" in res["message"]
    # at B = 0 (b = -1) the A:B interaction takes 0.10 off A's slope
    assert abs({t["term"]: t["coefficient"] for t in res["terms"]}["A"] - 0.20) < 0.002
    nightlab("cancel", *(e["id"] for e in slow["experiments"] if e["id"] not in fast), cwd=lab)
    # every run crashed: say so, no numbers
    crash = sweep(lab, "CRASH=1,2", "-m", "crash")
    wait_json(lab, *(e["id"] for e in crash["experiments"]))
    code, stdout, stderr = cli_inprocess(lab, "effects", crash["wave"])
    assert code == 1 and "all 2 runs crashed; no effects to estimate" in stderr and stdout == ""
    noise = nightlab("noise", "--json", cwd=lab)
    code, _, stderr = cli_inprocess(lab, "effects", json.loads(noise.stdout)["wave"])
    assert code == 2 and "has no factors" in stderr
