"""`nightlab sweep`: each design, the wave in the ledger, reuse of measured points, bad input."""

from __future__ import annotations

import json

from labkit import nightlab, wait_json


def sweep(lab, *args: str) -> dict:
    return json.loads(nightlab("sweep", *args, "--json", cwd=lab).stdout)


def wave(lab, wave_id: str) -> dict:
    return json.loads(nightlab("waves", wave_id, "--json", cwd=lab).stdout)


def test_full_factorial_wave_is_recorded_and_reuses_the_incumbent_point(quick_lab):
    lab = quick_lab()
    out = sweep(lab, "LR=0.01,0.02", "SLEEP=0.1,0.05", "-m", "lr x sleep")
    # the incumbent had no run: it is re-measured first, and its own design point reuses that run
    remeasure = [e for e in out["experiments"] if e["source"] == "remeasure"]
    assert len(remeasure) == 1 and out["reused"] == {"0": remeasure[0]["id"]}
    assert len(out["experiments"]) == 4
    w = wave(lab, out["wave"])
    assert (
        w["design"] == "full"
        and w["tier"] == "cpu"
        and w["spec"]["spaces"] == ["LR=0.01,0.02", "SLEEP=0.1,0.05"]
    )
    assert w["spec"]["design"]["kind"] == "full" and len(w["spec"]["runs"]) == 4
    wait_json(lab, *(e["id"] for e in out["experiments"]))
    w = wave(lab, out["wave"])
    assert (w["finished"], w["pending"], w["crashed"]) == (4, 0, 0)
    assert w["best"]["val_bpb"] < 1.01 and w["incumbent"]["n"] == 1
    # the plain-text id on stdout is what scripts capture
    again = nightlab("sweep", "LR=0.015,0.025", "--repeats", "2", "-m", "again", cwd=lab)
    assert again.stdout.strip() == "w002" and "4 experiments queued" in again.stderr
    listing = json.loads(nightlab("waves", "--json", cwd=lab).stdout)
    assert [w["id"] for w in listing] == ["w001", "w002"]


def test_fractional_random_and_optuna_designs(quick_lab):
    lab = quick_lab(slots=1, sleep=0.05)
    frac = sweep(
        lab, "LR=0.015,0.03", "SLEEP=0.05,0.06", "NOISE=0.01,0.02", "--design", "fractional", "-m", "f"
    )
    spec = wave(lab, frac["wave"])["spec"]["design"]
    assert spec["kind"] == "fractional" and spec["resolution"] == 3 and len(spec["runs"]) == 4
    rnd = sweep(lab, "LR=log(0.005,0.05)", "--design", "random", "--size", "3", "--seed", "1", "-m", "r")
    assert len([e for e in rnd["experiments"] if e["source"] == "sweep"]) == 3
    first = sweep(lab, "LR=log(0.005,0.05)", "--design", "optuna", "--size", "3", "-m", "o1")
    assert len(first["experiments"]) == 3
    wait_json(lab, "--all")
    # the second Optuna batch is told the first one's results and proposes new points
    second = sweep(lab, "LR=log(0.005,0.05)", "--design", "optuna", "--size", "3", "-m", "o2")
    old = {e["params"]["LR"] for e in first["experiments"]}
    new = {e["params"]["LR"] for e in second["experiments"]}
    assert len(new) == 3 and not old & new
    assert wave(lab, second["wave"])["spec"]["sampler"] == "tpe"


def test_bad_input_is_a_usage_error(quick_lab):
    lab = quick_lab()
    cases = {
        ("sweep", "LX=0.1,0.2"): "unknown knob `LX`; did you mean `LR`? known knobs: LR",
        ("sweep", "LR=uniform(0.01)"): "NAME=int(lo,hi)",
        ("sweep",): "empty design",
        ("sweep", "LR=0.02"): "LR",
        ("sweep", "MODE=uniform(0,1)"): "MODE",
    }
    for args, text in cases.items():
        proc = nightlab(*args, cwd=lab, check=False)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.startswith("error: ") and text in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1
    assert json.loads(nightlab("waves", "--json", cwd=lab).stdout) == []


def test_stale_incumbent_is_re_measured_inside_the_wave(quick_lab):
    from labkit import commit

    lab = quick_lab(sleep=0.05)
    toml = lab / "nightlab.toml"
    toml.write_text(toml.read_text().replace("incumbent_max_age_waves = 3", "incumbent_max_age_waves = 1"))
    commit(lab, "re-measure after one wave")
    sources = []
    for lr in ("0.015,0.02", "0.025,0.03", "0.035,0.04"):
        out = sweep(lab, f"LR={lr}", "-m", lr)
        sources.append(sorted(e["source"] for e in out["experiments"]))
    # never measured -> measured; 1 wave old -> fine; 2 waves old -> measured again (a new seed)
    assert sources == [["remeasure", "sweep", "sweep"], ["sweep", "sweep"], ["remeasure", "sweep", "sweep"]]
    with_seeds = json.loads(nightlab("waves", "w003", "--json", cwd=lab).stdout)["experiments"]
    assert [e["seed"] for e in with_seeds if e["source"] == "remeasure"] == [1]
