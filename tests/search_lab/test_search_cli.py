"""`nightlab search`: the research loop through the real CLI and fleet, adoption only of a
significant winner, and resuming from the ledger after an interruption."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from labkit import nightlab
from nightlab.ledger import open_ledger

WIDE = "LR=log(0.005,0.08)"  # the incumbent LR 0.01 sits at coded -0.5, the optimum 0.02 at 0


def knob(lab, name: str) -> str:
    rows = json.loads(nightlab("knobs", "--json", cwd=lab).stdout)
    return next(r["source"] for r in rows if r["name"] == name)


def test_greedy_adopts_only_a_significant_winner_and_resumes(quick_lab):
    lab = quick_lab(slots=1, sleep=0.05)
    # a gain inside the noise: measured, not adopted
    proc = nightlab("search", "--strategy", "greedy", "--space", "LR=0.01,0.01001", "--waves", "1", cwd=lab)
    assert "no noise floor on tier cpu: running the incumbent 3 times alongside the first wave" in proc.stderr
    [line] = proc.stdout.splitlines()
    assert line.startswith("w002 (search wave 1): 1/1 runs, best val_bpb") and line.endswith("within-noise")
    assert knob(lab, "LR") == "0.01"
    # settling the within-noise best would take 7 runs (the floor of 3 repeats has 2 dof: t 4.53),
    # more than one round of the tier: it is left to the user
    assert (
        "w002: best e0004 is within the noise and not settled: it needs 7 + 0 runs, more than one "
        "round of tier cpu (1 slot, at least 4)"
    ) in proc.stderr
    runs = json.loads(nightlab("waves", "w002", "--json", cwd=lab).stdout)["experiments"]
    assert not [e for e in runs if e["source"] == "settle"]
    # a real gain: one run is not enough to keep (its spread is unknown), so it gets the one
    # repeat a keep needs, is adopted, and the next wave is centred on it
    proc = nightlab("search", "--strategy", "greedy", "--space", WIDE, "--waves", "2", cwd=lab)
    assert "w003: best e0005 is within the noise; 1 + 0 runs to settle it" in proc.stderr
    runs = json.loads(nightlab("waves", "w003", "--json", cwd=lab).stdout)["experiments"]
    assert [e["seed"] for e in runs if e["source"] == "settle"] == [1]
    first, second = proc.stdout.splitlines()
    assert first.startswith("w003 (search wave 1): 1/1 runs") and ", adopted e" in first
    assert second.startswith("w004 (search wave 2): 1/1 runs") and "adopted" not in second
    assert knob(lab, "LR") == "0.02"
    assert (
        "adopt"
        in subprocess.run(["git", "log", "-1", "--format=%s"], cwd=lab, capture_output=True, text=True).stdout
    )
    # the same command with a larger budget resumes: two waves judged, one more to run
    proc = nightlab("search", "--strategy", "greedy", "--space", WIDE, "--waves", "3", cwd=lab)
    assert "resuming: 2 waves judged" in proc.stderr
    assert [line.split(":")[0] for line in proc.stdout.splitlines()] == ["w005 (search wave 3)"]


def test_factorial_and_optuna_waves(quick_lab):
    lab = quick_lab(slots=2, sleep=0.05)
    nightlab("noise", "--repeats", "3", "--wait", cwd=lab)
    proc = nightlab(
        "search",
        "--strategy",
        "factorial",
        "--space",
        WIDE,
        "--space",
        "SLEEP=uniform(0.03,0.07)",
        "--waves",
        "1",
        "--wave-size",
        "4",
        "--json",
        cwd=lab,
    )
    out = json.loads(proc.stdout)
    [wave] = out["waves"]
    assert wave["proposed"] == 4 and wave["adopted"] == wave["best"]["id"]
    assert out["incumbent"]["LR"] == "0.02" and knob(lab, "LR") == "0.02"
    search = json.loads(nightlab("waves", wave["wave"], "--json", cwd=lab).stdout)["search"]
    assert search["key"]["strategy"] == "factorial" and search["judged"] is True
    assert search["stepped"] is None  # the main-effects step is opt-in
    proc = nightlab(
        "search", "--strategy", "optuna", "--space", WIDE, "--waves", "1", "--wave-size", "2", cwd=lab
    )
    [line] = proc.stdout.splitlines()
    assert re.match(r"w\d{3} \(search wave 1\): 2/2 runs", line)


def ctrl_c_as_at_a_terminal() -> None:
    """Give the child the SIGINT disposition a terminal's foreground job has.

    A suite started in the background (`make test &`, `nohup`) runs with SIGINT ignored, and a
    child inherits that: its Ctrl-C would never arrive (three full runs timed out so, session 31).
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def search_until_waiting(lab, strategy: str) -> tuple[subprocess.Popen, list[str]]:
    """Start `search --waves 1` over WIDE and read its stderr up to its first progress line,
    which it prints once it waits for submitted runs: (the process, the lines read)."""
    args = [
        sys.executable,
        "-m",
        "nightlab",
        "search",
        "--strategy",
        strategy,
        "--space",
        WIDE,
        "--waves",
        "1",
    ]
    proc = subprocess.Popen(
        args,
        cwd=lab,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
        preexec_fn=ctrl_c_as_at_a_terminal,
    )
    said = []
    for line in proc.stderr:
        said.append(line)
        if re.search(r"\d+ done, \d+ running, \d+ queued", line):
            break
    return proc, said


def interrupt_once_submitted(lab, strategy: str, gate: Path):
    """Start the search and Ctrl-C it once it waits for submitted runs: (the wave, the process, its stderr).

    The lab's runs wait for `gate` (a file `quick_lab(gate=...)` names), so none ends before the
    signal, however loaded the box.
    """
    gate.unlink(missing_ok=True)
    proc, said = search_until_waiting(lab, strategy)
    proc.send_signal(signal.SIGINT)
    # the search acts on the Ctrl-C between ledger calls: on a loaded 2-core box that took over 30 s
    try:
        assert proc.wait(timeout=120) == 130, "".join(said)
    except subprocess.TimeoutExpired:
        proc.kill()  # a search that missed its Ctrl-C must not outlive the test (one ran 2 h so)
        raise
    said.append(proc.stderr.read())
    with open_ledger(lab) as ledger:
        [wave] = [w for w in ledger.waves() if ledger.search_progress(w.id) and ledger.experiments(wave=w.id)]
    return wave, proc, "".join(said)


def test_interrupted_search_resumes_its_wave(quick_lab, tmp_path):
    gate = tmp_path / "gate"
    gate.touch()
    lab = quick_lab(slots=2, sleep=0.5, gate=str(gate))
    nightlab("noise", "--repeats", "2", "--wait", cwd=lab)
    wave, proc, said = interrupt_once_submitted(lab, "greedy", gate)
    assert proc.stdout.read() == ""  # interrupted before the wave was judged
    # what happens to the runs, and how to go on
    assert "search interrupted: the lab's 1 queued/running run(s) keep running on the fleet" in said
    assert "run the same command again to resume from the ledger" in said
    gate.touch()
    started = time.time()
    again = nightlab("search", "--strategy", "greedy", "--space", WIDE, "--waves", "1", cwd=lab)
    assert f"resuming: 0 waves judged, waiting for {wave.id}" in again.stderr
    assert again.stdout.startswith(f"{wave.id} (search wave 1): 1/1 runs") and "adopted" in again.stdout
    assert time.time() - started < 120  # one 0.5 s wave, not a re-run of the search (loose: busy box)
    with open_ledger(lab) as ledger:
        assert len(ledger.waves()) == 2  # the noise wave and the one search wave, nothing re-submitted


def test_factorial_effects_step_runs_the_predicted_point(quick_lab):
    lab = quick_lab(slots=2, sleep=0.05)
    nightlab("noise", "--repeats", "3", "--wait", cwd=lab)
    args = ("--space", WIDE, "--space", "SLEEP=uniform(0.03,0.07)", "--waves", "1", "--wave-size", "4")
    out = json.loads(
        nightlab("search", "--strategy", "factorial", *args, "--effects-step", "--json", cwd=lab).stdout
    )
    [wave] = out["waves"]
    w = json.loads(nightlab("waves", wave["wave"], "--json", cwd=lab).stdout)
    stepped = w["search"]["stepped"]
    # LR's effect is significant and moves to its better level (0.02); SLEEP's is not and stays
    runs = {e["id"]: e for e in w["experiments"]}
    assert len(stepped) == 2 and {runs[i]["params"]["LR"] for i in stepped} == {"0.02"}
    assert {runs[i]["params"]["SLEEP"] for i in stepped} == {"0.05"}
    assert wave["adopted"] is not None and knob(lab, "LR") == "0.02"


def test_pattern_measures_the_fitted_point_twice_in_one_snapshot(quick_lab):
    lab = quick_lab(slots=2, sleep=0.05, noise=0.001)
    nightlab("noise", "--repeats", "3", "--wait", cwd=lab)
    proc = nightlab(
        "search",
        "--strategy",
        "pattern",
        "--space",
        WIDE,
        "--waves",
        "2",
        "--wave-size",
        "4",
        "--json",
        cwd=lab,
    )
    first, second = json.loads(proc.stdout)["waves"]
    # a stencil on LR; the fitted point x2 + the first wave's best x2 (its repeats: a keep needs
    # two runs, and pattern runs them with this wave, not in a settle round of their own)
    assert (first["proposed"], second["proposed"]) == (2, 4)
    assert first["adopted"] is None and first["verdict"] == "within-noise"
    stencil = json.loads(nightlab("waves", first["wave"], "--json", cwd=lab).stdout)["experiments"]
    assert [e["source"] for e in stencil] == ["search", "search"]  # no settle run
    best = next(e["params"]["LR"] for e in stencil if e["id"] == first["best"]["id"])
    runs = json.loads(nightlab("waves", second["wave"], "--json", cwd=lab).stdout)["experiments"]
    by_point: dict[str, list[int]] = {}
    for e in runs:
        by_point.setdefault(e["params"]["LR"], []).append(e["seed"])
    # a point listed twice is one submission with two unused seeds, not a duplicate refused;
    # the parabola through the stencil finds the optimum of the synthetic target (LR = 0.02)
    assert by_point.pop(best) == [1, 2]
    [(point, seeds)] = by_point.items()
    assert seeds == [0, 1] and abs(float(point) - 0.02) < 0.0005


def test_the_noise_floor_runs_alongside_the_first_wave(quick_lab):
    lab = quick_lab(slots=4, sleep=0.5)
    proc = nightlab("search", "--strategy", "surface", "--space", WIDE, "--waves", "1", cwd=lab)
    assert "no noise floor on tier cpu: running the incumbent 3 times alongside the first wave" in proc.stderr
    assert "noise floor on cpu: 0.0" in proc.stderr
    # piped, the wait shows one line per change: runs done / running / queued, then the best so far
    live = [line for line in proc.stderr.splitlines() if line.startswith("w002 (search wave 1): ")]
    assert len(live) >= 2 and len(set(live)) == len(live)
    assert live[-1].startswith("w002 (search wave 1): 4 done, 0 running, 0 queued, best val_bpb ")
    # the 4 slots hold the 3 repeats and a first wave of 1 run, in one round (then the winner's
    # one settle repeat: a keep needs two runs)
    assert proc.stdout.startswith("w002 (search wave 1): 1/1 runs")
    with open_ledger(lab) as ledger:
        floor, first = ledger.experiments(wave="w001"), ledger.experiments(wave="w002")
    assert len(floor) == 3 and [e.source for e in first] == ["search", "settle"]
    assert first[0].started_at < min(e.finished_at for e in floor)


def test_a_search_interrupted_with_the_noise_floor_in_flight_does_not_run_it_twice(quick_lab, tmp_path):
    gate = tmp_path / "gate"
    lab = quick_lab(slots=4, sleep=0.5, gate=str(gate))
    interrupt_once_submitted(lab, "surface", gate)
    proc, said = search_until_waiting(lab, "surface")  # the resumed search, its runs still at the gate
    gate.touch()
    out, rest = proc.communicate(timeout=60)
    assert proc.returncode == 0, rest
    said = "".join(said) + rest
    # the floor in flight is waited for and reported, not submitted again
    assert "no noise floor" not in said and "noise floor on cpu: 0.0" in said
    assert out.startswith("w002 (search wave 1): 1/1 runs")
    with open_ledger(lab) as ledger:
        # the floor's 3, the wave's 1 and its settle repeat
        assert [len(ledger.experiments(wave=w.id)) for w in ledger.waves()] == [3, 2]


def test_a_resumed_surface_search_proposes_what_the_uninterrupted_one_did(quick_lab):
    args = ["search", "--strategy", "surface", "--space", WIDE, "--wave-size", "4", "--json"]

    def third_wave(lab) -> list[str]:
        [wave] = json.loads(nightlab(*args, "--waves", "3", cwd=lab).stdout)["waves"][-1:]
        runs = json.loads(nightlab("waves", wave["wave"], "--json", cwd=lab).stdout)["experiments"]
        return sorted(e["params"]["LR"] for e in runs if e["source"] == "search")

    straight = quick_lab(slots=4, sleep=0.05, noise=0.002, name="straight")
    resumed = quick_lab(slots=4, sleep=0.05, noise=0.002, name="resumed")
    waves = json.loads(nightlab(*args, "--waves", "2", cwd=resumed).stdout)["waves"]
    assert any(w["adopted"] for w in waves)  # the resume has an earlier incumbent to replay
    assert third_wave(resumed) == third_wave(straight)


def test_a_within_noise_best_out_of_reach_says_why_it_is_not_settled(quick_lab):
    from nightlab.lab import Lab
    from nightlab.search.decide import Decision, Repeats
    from nightlab.search_loop import SearchPlan, _LabLoop

    lab_dir = quick_lab(slots=1, sleep=0.05)
    nightlab("sweep", "LR=0.01,0.011", "-m", "close", cwd=lab_dir)
    nightlab("wait", "--all", "--timeout", "60", cwd=lab_dir)
    notes: list[str] = []
    with Lab.open(lab_dir) as lab:
        [wave] = lab.ledger.waves()
        with lab.ledger.transaction() as c:  # the sweep's wave stands in for a search's first wave
            c.execute("INSERT INTO search_waves (wave_id, search_key, idx) VALUES (?, '{}', 0)", (wave.id,))
        plan = SearchPlan("greedy", ("LR=0.01,0.011",), "cpu", None, 1, 1, 2)
        loop = _LabLoop(lab, plan, [], poll=0.05, note=notes.append)
        far = Decision("within-noise", 0.001, 0.002, 0.5, Repeats(candidate=7, incumbent=2), "close")
        assert loop.settle(wave.id, "e0002", far) is False
        assert notes == [
            f"{wave.id}: best e0002 is within the noise and not settled: it needs 7 + 2 runs, more than "
            "one round of tier cpu (1 slot, at least 4); queue them by hand with "
            "`nightlab submit --from e0002 --repeats 7`"
        ]
        assert loop.settle(wave.id, "e0002", Decision("within-noise", 0.0, None, None, None, "?")) is False
        assert "no affordable number of repeats" in notes[-1]
        # no noise floor (its runs failed): a gain is no longer left unsettled; the best gets the
        # run a keep needs and the incumbent (one run, e0001's files) the two more of a floor
        unfloored = Decision("within-noise", 0.3, None, None, None, "single run and no noise floor")
        assert loop.settle(wave.id, "e0002", unfloored) is True
        assert notes[-1] == f"{wave.id}: best e0002 is within the noise; 1 + 2 runs to settle it"
        assert lab.judge().sigma("cpu") is not None


def test_search_without_a_strategy_runs_pattern(quick_lab):
    # the default is the strategy that held best on bench/search_family.py (docs/search.md)
    lab = quick_lab(slots=2, sleep=0.05)
    nightlab("noise", "--repeats", "3", "--wait", cwd=lab)
    out = json.loads(nightlab("search", "--space", WIDE, "--waves", "1", "--json", cwd=lab).stdout)
    [wave] = out["waves"]
    search = json.loads(nightlab("waves", wave["wave"], "--json", cwd=lab).stdout)["search"]
    assert search["key"]["strategy"] == "pattern"
    assert "[default: pattern]" in " ".join(nightlab("search", "--help", cwd=lab).stdout.split())


def test_the_search_waits_for_the_re_run_of_a_degraded_run(quick_lab):
    """A run that ends degraded is counted as degraded, not crashed, and the search waits for the
    re-run the controller queues for it (before, it went on without it and judged nothing)."""
    import threading
    from dataclasses import replace

    from nightlab import snapshots
    from nightlab.lab import Lab
    from nightlab.ledger import NewExperiment
    from nightlab.search_loop import SearchPlan, WaitProgress, _LabLoop

    lab_dir = quick_lab(slots=1, sleep=0.05)
    first = nightlab("submit", "-m", "idea", "--no-start", cwd=lab_dir).stdout.split()[0]
    seen: list[WaitProgress] = []
    with Lab.open(lab_dir) as lab:
        ledger = lab.ledger
        ledger.register_workers([("starved", "cpu", "local", {})])
        ledger.finish_attempt(ledger.lease_next("starved", "cpu").id, outcome="degraded")
        exp = ledger.get(first)

        def controller() -> None:  # the second step, a moment after the degraded end
            rerun = NewExperiment(
                exp.snapshot,
                exp.identity,
                exp.parent,
                f"re-run of {first} (degraded)",
                "cpu",
                exp.seed,
                epoch=exp.epoch,
                rerun_of=first,
            )

            def make_ref(experiments) -> None:
                snapshots.set_ref(lab_dir, experiments[0].id, exp.snapshot)

            with open_ledger(lab_dir) as own:  # its own connection, as the controller's process has
                [again] = own.add_experiments([rerun], before_commit=make_ref)
                own.log_event("rerun", again.id, of=first, worker="starved")

        plan = SearchPlan("greedy", ("LR=0.01,0.02",), "cpu", None, 1, 1, 2)
        loop = _LabLoop(lab, plan, [], poll=0.05, note=lambda _: None, progress=seen.append)
        timer = threading.Timer(0.5, controller)
        timer.start()
        try:
            ended = loop.wait_ids([first], "w001 (search wave 1)")
        finally:
            timer.join()
    assert [(e.id, e.degraded, e.ok) for e in ended] == [(first, True, False), ("e0002", False, True)]
    last = replace(seen[-1], elapsed=0.0)
    assert (last.done, last.crashed, last.degraded) == (2, 0, 1)
    assert last.line("val_bpb").startswith(
        "w001 (search wave 1): 2 done, 0 running, 0 queued (1 degraded, re-run)"
    )
    assert not [p for p in seen if p.crashed]


def test_one_slot_two_waves_make_two_new_runs(quick_lab):
    # before: wave 2 proposed wave 1's point again, which was reused, so `--waves 2` made one run
    lab = quick_lab(slots=1, sleep=0.05)
    nightlab("noise", "--repeats", "3", "--wait", cwd=lab)
    out = json.loads(nightlab("search", "--space", WIDE, "--waves", "2", "--json", cwd=lab).stdout)
    points = []
    for wave in out["waves"]:
        runs = json.loads(nightlab("waves", wave["wave"], "--json", cwd=lab).stdout)["experiments"]
        mine = [e["params"]["LR"] for e in runs if e["source"] == "search"]
        assert len(mine) == 1, runs
        points += mine
    assert len(set(points)) == 2
