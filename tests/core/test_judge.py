"""The judge (`nightlab.judge`) is the one writer of verdicts, and every caller of a shared rule agrees.

Runs are ended through the controller's own recording path (`Controller._finish`, the one the
dispatch loop uses), with metric values chosen by the test instead of a training run, so the
numbers of each verdict are exact. `nightlab results` is the real CLI.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

import nightlab as nightlab_pkg
from labkit import nightlab
from nightlab import search_loop, waves
from nightlab.errors import DuplicateExperimentError, NightlabError, UsageError
from nightlab.fleet.backend import BaseBackend, WorkerSlot
from nightlab.fleet.controller import Controller
from nightlab.lab import Lab, apply_sets
from nightlab.ledger import AttemptEnd, ExperimentStatus, Outcome, Source, Verdict

SRC = Path(nightlab_pkg.__file__).parent


def _controller(lab: Lab, backends: dict | None = None, slots: list | None = None) -> Controller:
    return Controller(
        lab.path, lab.config, lab.ledger, slots=slots or [], backends=backends or {}, policy=lab.judge()
    )


def _run(lab: Lab, ctrl: Controller, values: dict[str, float | None], outcome: str = "ok") -> None:
    """Lease and end every queued run, in the controller's order, with the metric the test chose."""
    while (attempt := lab.ledger.lease_next("cpu-0", "cpu")) is not None:
        value = values[attempt.experiment_id]
        metrics = {} if value is None else {"val_bpb": value}
        ctrl._finish(attempt, outcome=Outcome(outcome), detail=None, metrics=metrics)


def _candidate(lab: Lab, lr: str, *, wave: str | None = None, n: int = 1, source=Source.CLI):
    return lab.submit(
        f"lr {lr}",
        sets={"LR": lr},
        repeats=n,
        fresh_seeds=n > 1,
        wave=wave,
        source=source,
        start_controller=False,
    )


@pytest.fixture
def lab(make_lab):
    with Lab.open(make_lab(slots=1)) as opened:
        yield opened


def _measure_incumbent(lab: Lab, ctrl: Controller, values: list[float]) -> None:
    noise = waves.noise(lab, repeats=len(values), tier="cpu", start_controller=False)
    _run(lab, ctrl, {e.id: v for e, v in zip(noise.experiments, values, strict=True)})


# --- symptom (a): the settle hint and the stored verdict use the same z --------------------------


def test_the_settle_hint_of_results_settles_the_stored_verdict(lab):
    """A wave of 4 candidates is judged at the Sidak z (2.53, not 2; with the floor's 2 dof the
    t threshold is 9.26): the hint must ask for the repeats that clear that threshold, counting
    the dof they add. With the uncorrected z it asked for 1 repeat, after which the stored verdict
    was still within-noise (z 2.45 < 2.53)."""
    ctrl = _controller(lab)
    _measure_incumbent(lab, ctrl, [1.00, 1.01, 0.99])  # mean 1.00, noise floor 0.01
    wave = waves.submit_wave(
        lab,
        [{"LR": "0.011"}, {"LR": "0.012"}, {"LR": "0.013"}, {"LR": "0.014"}],
        design="full",
        description="four",
        tier="cpu",
        start_controller=False,
    )
    ids = [e.id for e in wave.experiments]
    _run(lab, ctrl, dict(zip(ids, [0.98, 1.02, 1.03, 1.04], strict=True)))
    best = lab.ledger.get(ids[0])
    assert best.verdict == Verdict.WITHIN_NOISE  # gain 0.02 = 1.73 se
    hint = next(line for line in nightlab("results", cwd=lab.path).stderr.splitlines() if best.id in line)
    repeats = int(re.search(r"--repeats (\d+)", hint).group(1))
    assert repeats == lab.judge().decision(best.identity, "cpu").repeats_to_settle.candidate
    # the repeats, in the wave as the search's settle repeats are (`--from` outside it is judged
    # with the same z: the wave the snapshot first ran in)
    files, base = lab.files_of(best.id)
    more = lab.submit(
        "repeat",
        overrides=files,
        base=base,
        repeats=repeats,
        fresh_seeds=True,
        wave=best.wave,
        start_controller=False,
    )
    # they scatter as the floor does (sd 0.01), so the gain holds at the mean the hint assumed
    _run(lab, ctrl, {e.id: 0.98 + 0.01 * (-1, 1, 0)[i % 3] for i, e in enumerate(more)})
    assert {lab.ledger.get(e.id).verdict for e in [best, *more]} == {Verdict.KEEP}


# --- symptom (b): a refused launch is judged like a run that says it is invalid -----------------


class _RefusingBackend(BaseBackend):
    name = "refusing"

    def __init__(self, error: Exception) -> None:
        self.error = error

    def launch(self, slot, spec):
        raise self.error

    def poll(self, slot, spec, handle):
        return None

    def kill(self, slot, spec, handle):
        return None


def _launch(lab: Lab, error: Exception) -> str:
    [exp] = _candidate(lab, "0.03")
    slot = WorkerSlot("cpu-0", "cpu", "refusing", info={"threads": 1})
    ctrl = _controller(lab, {"refusing": _RefusingBackend(error)}, [slot])
    for _ in range(1 + lab.config.fleet.retries):
        ctrl._dispatch()
    return exp.id


def test_a_launch_refused_and_a_run_that_reports_itself_invalid_get_the_same_verdict(lab):
    refused = lab.ledger.get(_launch(lab, NightlabError("snapshot is gone")))
    [reported] = _candidate(lab, "0.04")
    _run(lab, _controller(lab), {reported.id: None}, outcome="invalid")
    reported = lab.ledger.get(reported.id)
    assert (
        (refused.outcome, refused.verdict)
        == (reported.outcome, reported.verdict)
        == ("invalid", Verdict.INVALID)
    )


def test_an_infra_launch_failure_that_used_up_its_retries_is_a_crash_like_a_run_that_vanished(lab):
    failed = lab.ledger.get(_launch(lab, OSError("disk full")))
    [vanished] = _candidate(lab, "0.05")
    ctrl = _controller(lab)
    for _ in range(1 + lab.config.fleet.retries):
        _run(lab, ctrl, {vanished.id: None}, outcome="infra")
    vanished = lab.ledger.get(vanished.id)
    assert failed.status == vanished.status and failed.attempts == vanished.attempts == 3
    assert (
        (failed.outcome, failed.verdict) == (vanished.outcome, vanished.verdict) == ("infra", Verdict.CRASH)
    )


def test_an_infra_end_of_a_run_whose_cancel_was_requested_is_final_and_judged_a_crash(lab):
    # retries are left, but a run someone asked to cancel is not queued again: its infra end is its
    # last, and the judge's table makes a last infra end a crash (the controller once judged it as a
    # retry, the ledger finished it: a finished run with no verdict)
    [run] = _candidate(lab, "0.06")
    attempt = lab.ledger.lease_next("cpu-0", "cpu")
    assert lab.ledger.request_cancel(run.id) == ExperimentStatus.RUNNING
    state, _ = _controller(lab)._finish(attempt, outcome=Outcome.INFRA, detail="worker lost")
    run = lab.ledger.get(run.id)
    assert (state, run.status, run.attempts) == (AttemptEnd.FINISHED, ExperimentStatus.FINISHED, 1)
    assert (run.outcome, run.verdict) == (Outcome.INFRA, Verdict.CRASH)


# --- one writer -----------------------------------------------------------------------------------


def _calls(path: Path) -> list[tuple[str, ast.Call]]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            out.append((node.func.attr, node))
    return out


def test_only_the_judge_writes_verdicts():
    writers = {}
    for path in SRC.rglob("*.py"):
        for name, call in _calls(path):
            verdict_kw = any(k.arg == "verdict" for k in call.keywords)
            if name in ("set_verdict", "mark_adopted") or (name == "finish_attempt" and verdict_kw):
                writers.setdefault(str(path.relative_to(SRC)), set()).add(name)
    # the controller stores what its injected policy (the judge) returned, in the end's transaction
    assert writers == {"judge.py": {"set_verdict", "mark_adopted"}, "fleet/controller.py": {"finish_attempt"}}
    text = (SRC / "fleet" / "controller.py").read_text()  # VerdictPolicy: fleet/backend.py
    assert "self.policy.end(" in text
    for module in ("fleet/controller.py", "fleet/daemon.py"):
        imports = {
            n.module
            for n in ast.walk(ast.parse((SRC / module).read_text()))
            if isinstance(n, ast.ImportFrom) and n.col_offset == 0
        }
        assert not imports & {"nightlab.analysis", "nightlab.search_loop", "nightlab.judge"}, module


def _base(lab: Lab, ctrl: Controller, values: list[float | None], outcome: str = "ok") -> list[str]:
    """Runs of the incumbent (HEAD's files) with fresh seeds, ended with `values` and `outcome`."""
    runs = lab.submit("base", repeats=len(values), fresh_seeds=True, start_controller=False)
    _run(lab, ctrl, {e.id: v for e, v in zip(runs, values, strict=True)}, outcome=outcome)
    return [e.id for e in runs]


def test_a_run_without_a_verdict_is_no_keep_and_a_forced_adoption_stays_on_record_as_unjudged(lab):
    """Issue 32: with the baseline degraded, a (worse) run has no verdict; `adopt` took it without
    `--force` and recorded `keep` (`keep +0.000000`)."""
    ctrl = _controller(lab)
    _base(lab, ctrl, [1.0, 1.0], outcome="degraded")  # the baseline's machine was starved
    [worse] = _candidate(lab, "0.005")
    _run(lab, ctrl, {worse.id: 1.5})
    assert lab.ledger.get(worse.id).verdict is None
    head = lab.head()
    refused = nightlab("adopt", worse.id, cwd=lab.path, check=False)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert f"{worse.id} has no verdict" in refused.stderr and "`nightlab noise --tier cpu`" in refused.stderr
    assert "`--force`" in refused.stderr and lab.head() == head
    nightlab("adopt", worse.id, "--force", cwd=lab.path)
    forced = lab.ledger.get(worse.id)
    assert forced.adopted_at is not None and forced.verdict is None
    row = next(
        e
        for e in json.loads(nightlab("results", "--json", cwd=lab.path).stdout)["experiments"]
        if e["id"] == worse.id
    )
    assert row["verdict"] is None and row["verdict_label"] == "incumbent (not judged)"
    line = next(x for x in nightlab("results", cwd=lab.path).stdout.splitlines() if x.startswith(worse.id))
    assert "incumbent (not judged)" in line and "keep" not in line
    # the forced incumbent's later runs carry `keep` (on the branch); its adopted run stays unjudged
    _base(lab, ctrl, [1.49, 1.51])
    assert lab.ledger.get(worse.id).verdict is None


def test_measuring_the_incumbent_judges_the_run_adopt_refused(lab):
    ctrl = _controller(lab)
    better, again = _candidate(lab, "0.02", n=2)
    _run(lab, ctrl, {better.id: 0.9, again.id: 0.901})  # the incumbent never ran: no verdict
    with pytest.raises(UsageError, match="which judges it"):
        lab.adopt(better.id)
    _measure_incumbent(lab, ctrl, [1.00, 1.01, 0.99])
    assert lab.ledger.get(better.id).verdict == Verdict.KEEP
    lab.adopt(better.id)


# --- one rule per duplicated decision ---------------------------------------------------------------


def test_promote_wave_and_the_search_loops_successive_halving_promote_the_same_candidates(lab, monkeypatch):
    """D is judged `discard` against a one-run incumbent; the incumbent's later runs make D's raw
    mean better than the incumbent's. The search loop used to promote D by raw mean while
    `nightlab promote --wave` did not (verdict keep / within-noise). The loop now promotes by
    successive halving (`nightlab.rungs`: the top 1/3 of the rung, ahead of the incumbent): of the
    3 snapshots the rung has seen, only A."""
    from nightlab import rungs

    ctrl = _controller(lab)
    key = {"strategy": "pattern", "spaces": [], "tier": "cpu", "screen_tier": "cpu"}
    wave = waves.submit_wave(
        lab,
        [{"LR": "0.019"}, {"LR": "0.03"}],
        design="search:pattern",
        description="screen",
        tier="cpu",
        search=(key, 0),
        spec=rungs.screen_spec("cpu", 2),
        source=Source.SEARCH,
        start_controller=False,
    )
    remeasure, a, d = wave.experiments
    assert remeasure.source == Source.REMEASURE
    _run(lab, ctrl, {remeasure.id: 1.00, a.id: 0.97, d.id: 1.005})
    more = waves.submit_incumbent(lab, "cpu", wave.wave.id, 2)
    _run(lab, ctrl, dict(zip([e.id for e in more], [1.02, 1.03], strict=True)))
    assert lab.ledger.get(d.id).verdict == Verdict.DISCARD
    # re-judged when the incumbent's runs ended: a gain, on one run (a keep needs two)
    assert lab.ledger.get(a.id).verdict == Verdict.WITHIN_NOISE

    picked: dict[str, list[str]] = {}

    def capture(name):
        def promote(lab, ids, **_):
            picked[name] = list(ids)
            raise _Stop

        return promote

    class _Stop(Exception):
        pass

    monkeypatch.setattr(waves._promote, "promote", capture("promote_wave"))
    with pytest.raises(_Stop):
        waves.promote_wave(lab, wave.wave.id, tier="cpu")
    monkeypatch.setattr(waves, "promote", capture("search"))
    with pytest.raises(_Stop):
        rungs.review(lab, "cpu")
    assert picked["promote_wave"] == picked["search"] == [a.id]
    # the failed promotion left no claim behind: the next review tries again, and D stays out
    decisions = rungs.decisions_for(lab.ledger.wave(wave.wave.id))
    assert not decisions[a.id]["claimed"] and decisions[a.id]["promoted"] is None
    assert (decisions[d.id]["rank"], decisions[d.id]["seen"], decisions[d.id]["cutoff"]) == (2, 3, 1)


@pytest.mark.parametrize("review", ["after-each-run", "once-at-the-end"])
def test_successive_halving_decides_as_of_each_run_s_end_so_a_late_review_promotes_the_same(
    review, lab, monkeypatch
):
    """Five screening runs end one after the other, each better than the last but the first two:
    reviewed after each run (the controller keeping up), the third, fourth and fifth are each in
    the top third of the rung when they end. A controller that reviews only at the end (busy, on a
    loaded box: seen in CI) used to rank the third among all six snapshots and drop it."""
    from types import SimpleNamespace

    from nightlab import judge, rungs

    ctrl = _controller(lab)
    _measure_incumbent(lab, ctrl, [1.00, 1.00])
    wave = waves.submit_wave(
        lab,
        [{"LR": f"0.0{i}"} for i in range(2, 7)],
        design="full",
        description="screen",
        tier="cpu",
        spec=rungs.screen_spec("cpu", 2),
        start_controller=False,
    )
    promoted: list[str] = []

    def promote(lab, ids, **_):
        promoted.extend(ids)
        return SimpleNamespace(wave=SimpleNamespace(id=f"w-{ids[0]}", spec={}))

    monkeypatch.setattr(waves, "promote", promote)
    if review == "once-at-the-end":
        monkeypatch.setattr(judge.Judge, "_review_rung", lambda self, tier: None)
    values, ended = iter([1.05, 1.08, 0.99, 0.97, 0.95]), []
    while (attempt := lab.ledger.lease_next("cpu-0", "cpu")) is not None:
        ended.append(attempt.experiment_id)
        ctrl._finish(attempt, outcome=Outcome("ok"), detail=None, metrics={"val_bpb": next(values)})
    assert len(ended) == 5 and set(ended) == {e.id for e in wave.experiments}
    if review == "once-at-the-end":
        assert not promoted
        rungs.review(lab, "cpu")
    assert sorted(promoted) == sorted(ended[2:])
    why = rungs.decisions_for(lab.ledger.wave(wave.wave.id))
    assert (why[ended[2]]["rank"], why[ended[2]]["seen"], why[ended[2]]["cutoff"]) == (
        1,
        4,
        1,
    )  # when it ended
    assert (why[ended[1]]["rank"], why[ended[1]]["seen"]) == (6, 6)  # never in the top: as it stands now
    # a review with nothing new (the controller reviews after every run on the rung) decides
    # nothing again and writes nothing: on a rung of thousands of ideas that was one write each
    spec = lab.ledger.wave(wave.wave.id).spec
    assert rungs.review(lab, "cpu") == [] and lab.ledger.wave(wave.wave.id).spec == spec


def test_waves_and_submit_apply_knobs_by_one_rule(lab):
    wave = waves.submit_wave(
        lab,
        [{"LR": "0.02", "SLEEP": "0.1"}],
        design="full",
        description="d",
        tier="cpu",
        start_controller=False,
    )
    point = next(e for e in wave.experiments if e.source == Source.SWEEP)
    with pytest.raises(DuplicateExperimentError):  # the same files: the same research identity
        lab.submit("again", sets={"SLEEP": "0.1", "LR": "0.02"}, start_controller=False)
    assert lab.files_of(point.id)[0] == apply_sets(lab.files_at(), {"LR": "0.02", "SLEEP": "0.1"})
    errors = []
    for submit in (
        lambda: lab.submit("bad", sets={"LX": "1"}, start_controller=False),
        lambda: waves.submit_wave(lab, [{"LX": "1"}], design="full", description="d", start_controller=False),
    ):
        with pytest.raises(UsageError) as info:
            submit()
        errors.append(str(info.value))
    assert errors[0] == errors[1] and "did you mean `LR`" in errors[0]


def test_head_files_are_read_by_one_rule(lab):
    [e] = lab.submit("as is", start_controller=False)
    assert lab.files_of(e.id)[0] == lab.files_at() == lab.files_at(lab.head())
    assert set(waves.head_knobs(lab)) >= {"LR", "SLEEP", "MODE", "NOISE"}


def test_a_wave_status_and_its_points_count_the_same_candidates(lab):
    ctrl = _controller(lab)
    [measured] = _candidate(lab, "0.02")
    wave = waves.submit_wave(
        lab,
        [{"LR": "0.02"}, {"LR": "0.03"}],
        design="full",
        description="d",
        tier="cpu",
        start_controller=False,
    )
    assert wave.reused  # LR 0.02 was measured before: reused, still a candidate
    fresh = next(e for e in wave.experiments if e.source == Source.SWEEP)
    waves.submit_incumbent(lab, "cpu", wave.wave.id, 1)
    lab.submit(
        "settle", sets={"LR": "0.03"}, seed=5, wave=wave.wave.id, source=Source.SETTLE, start_controller=False
    )
    _run(lab, ctrl, {e.id: 1.0 for e in lab.ledger.experiments()})
    status = waves.wave_status(lab, wave.wave.id)
    points = [e.id for e, _ in waves.wave_points(lab, lab.ledger.wave(wave.wave.id))]
    assert [e.id for e in status.candidates] == points == sorted([measured.id, fresh.id])


def test_results_tsv_writes_keep_only_for_what_was_adopted(lab):
    from nightlab.report import results_tsv

    ctrl = _controller(lab)
    _measure_incumbent(lab, ctrl, [1.00, 1.01, 0.99])
    better, better2 = _candidate(lab, "0.02", n=2)  # a keep needs two runs
    also, also2 = _candidate(lab, "0.021", n=2)
    _run(lab, ctrl, {better.id: 0.90, better2.id: 0.901, also.id: 0.91, also2.id: 0.911})
    assert {lab.ledger.get(i).verdict for i in (better.id, also.id)} == {Verdict.KEEP}
    lab.adopt(better.id)
    status = {
        line.split("\t")[4]: line.split("\t")[3]
        for line in results_tsv(lab.ledger, lab.config).splitlines()[1:]
    }
    assert status["lr 0.02"] == "keep" and status["lr 0.021"] == "discard"


def test_the_incumbent_is_looked_up_by_one_function():
    """`identity.incumbent` is the only reader of HEAD (one git process; identities are cached)."""
    readers = set()
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        if re.search(r"snapshots\.head\(|identity\.of\([^)]*\"HEAD\"|rev-parse\", \"HEAD\"\)", text):
            readers.add(str(path.relative_to(SRC)))
    assert readers == {"identity.py", "snapshots.py"}  # snapshots.head is the git call itself


def test_results_json_and_table_label_verdicts_by_one_rule(lab):
    from nightlab.judge import verdict_label

    assert (
        verdict_label(Verdict.WITHIN_NOISE, incumbent=True, earlier_incumbent=False)
        == "incumbent (was within-noise)"
    )
    assert (
        verdict_label(Verdict.KEEP, incumbent=True, earlier_incumbent=True) == "keep (vs earlier incumbent)"
    )
    assert verdict_label(None, incumbent=False, earlier_incumbent=False) == "-"
    ctrl = _controller(lab)
    _measure_incumbent(lab, ctrl, [1.00, 1.01, 0.99])
    better, again = _candidate(lab, "0.02", n=2)  # a keep needs two runs
    _run(lab, ctrl, {better.id: 0.9, again.id: 0.901})
    lab.adopt(better.id)
    rows = {e["id"]: e for e in json.loads(nightlab("results", "--json", cwd=lab.path).stdout)["experiments"]}
    assert rows[better.id]["verdict_label"] == "keep"
    table = nightlab("results", cwd=lab.path).stdout
    base = next(i for i, e in rows.items() if e["verdict"] == "baseline")
    assert (
        rows[base]["verdict_label"] == "baseline (vs earlier incumbent)"
        or rows[base]["verdict_label"] in table
    )


def test_the_dashboard_styles_verdicts_by_the_judges_context_not_a_rule_of_its_own():
    from pathlib import Path

    import nightlab.web
    from nightlab.judge import verdict_context, verdict_label

    cases = {
        (Verdict.WITHIN_NOISE, True, False): ("incumbent", "incumbent (was within-noise)"),
        (Verdict.KEEP, True, False): (None, "keep"),
        (Verdict.DISCARD, False, True): ("earlier incumbent", "discard (vs earlier incumbent)"),
        (None, False, False): (None, "-"),
    }
    for (verdict, incumbent, earlier), want in cases.items():
        seen = {"incumbent": incumbent, "earlier_incumbent": earlier}
        assert (verdict_context(verdict, **seen), verdict_label(verdict, **seen)) == want
    templates = Path(nightlab.web.__file__).parent / "templates"
    text = "".join(p.read_text() for p in templates.glob("*.html"))
    assert "r.verdict_context ==" in text
    assert "r.incumbent" not in text and "r.earlier_incumbent" not in text


# --- the noise rule: the floor's degrees of freedom count (issue 17) ----------------------------


def test_every_verdict_uses_the_floor_with_its_degrees_of_freedom(lab):
    """The floor pooled from 3 repeats of the incumbent and 2 of a candidate has 3 dof: the stored
    verdict, the decision behind the settle hint and the best of a wave all use the t quantile
    for them (3.31 at z = 2, not 2). A gain of 2.7 se was a keep under the old rule (z as if the
    floor were exact) and is within-noise now."""
    from nightlab.search.decide import critical

    ctrl = _controller(lab)
    _measure_incumbent(lab, ctrl, [1.00, 1.01, 0.99])
    [a, b] = _candidate(lab, "0.02", n=2)
    _run(lab, ctrl, {a.id: 0.982, b.id: 0.9821})
    judge = lab.judge()
    sigma, dof = judge.floor("cpu")
    assert dof == 3 and judge.sigma("cpu") == sigma
    decision = judge.decision(a.identity, "cpu")
    assert decision.dof == 3 and decision.threshold == pytest.approx(critical(2.0, 3))
    assert 2.0 < decision.z_score < decision.threshold
    assert lab.ledger.get(a.id).verdict == lab.ledger.get(b.id).verdict == Verdict.WITHIN_NOISE
    picked = judge.best_of_wave({a.id: a.identity}, "cpu")
    assert picked[0] == a.id and picked[1] == decision


# --- the morning view says what a result rests on (issue 32) -------------------------------------


def _stderr_line(lab: Lab, *needles: str, args: tuple[str, ...] = ()) -> str:
    said = nightlab("results", *args, cwd=lab.path).stderr.splitlines()
    return next(line for line in said if all(n in line for n in needles))


def test_a_large_gain_on_one_run_a_side_is_told_what_evidence_is_missing(lab):
    """37 % better on one run a side, no noise floor: not "too small to settle", but one more run
    and the tier's noise floor."""
    ctrl = _controller(lab)
    _base(lab, ctrl, [1.0])
    [better] = _candidate(lab, "0.02")
    _run(lab, ctrl, {better.id: 0.63})
    assert lab.ledger.get(better.id).verdict == Verdict.WITHIN_NOISE
    hint = _stderr_line(lab, f"{better.id} is within noise")
    assert "too small" not in hint and "no gain" not in hint
    assert "(+0.370000) cannot be weighed yet" in hint and "one run a side shows no spread" in hint
    assert (
        f"`nightlab submit --from {better.id} --repeats 1" in hint and "`nightlab noise --tier cpu`" in hint
    )
    # the dashboard and `show --json` give the decision's reason and the same next step
    shown = json.loads(nightlab("show", better.id, "--json", cwd=lab.path).stdout)
    assert shown["reason"] == "single run and no noise floor; measure it with `nightlab noise`"
    assert shown["next_step"] == hint
    said = " ".join(nightlab("show", better.id, "--no-diff", cwd=lab.path).stdout.split())  # rich wraps
    assert f"why {shown['reason']}" in said and f"next {hint}" in said


def test_a_gain_out_of_reach_is_called_so_with_its_numbers(lab):
    ctrl = _controller(lab)
    _measure_incumbent(lab, ctrl, [1.00, 1.10, 0.90])  # a floor of 0.1
    [close] = _candidate(lab, "0.02")
    _run(lab, ctrl, {close.id: 0.9999})
    hint = _stderr_line(lab, f"{close.id} is within noise")
    assert "would need more than 64 more runs a side to settle; treat it as no gain" in hint


def test_a_verdict_judged_on_an_earlier_figure_of_the_incumbent_is_marked(lab):
    """A `discard` against one run of the incumbent sat, unmarked, beside a negative delta once
    the incumbent's mean of three moved past it."""
    ctrl = _controller(lab)
    _base(lab, ctrl, [1.00])
    [late] = _candidate(lab, "0.02")
    _run(lab, ctrl, {late.id: 1.005})
    assert lab.ledger.get(late.id).verdict == Verdict.DISCARD
    _base(lab, ctrl, [1.02, 1.03])  # the incumbent's mean is 1.0167 now: the discard is 0.012 better
    rows = {e["id"]: e for e in json.loads(nightlab("results", "--json", cwd=lab.path).stdout)["experiments"]}
    row = rows[late.id]
    assert row["delta"] < 0 and row["earlier_figure"] and not row["earlier_incumbent"]
    assert row["verdict_label"] == "discard (vs earlier figure)"
    assert not any(r["earlier_figure"] for i, r in rows.items() if i != late.id)
    line = _stderr_line(lab, "vs earlier figure")
    assert f"e.g. {late.id} against 1.000000 (n=1), today 1.016667 (n=3)" in line
    # a within-noise verdict is re-judged on the new figure and stored with it: not marked
    [close] = _candidate(lab, "0.021")
    _run(lab, ctrl, {close.id: 1.01})
    _base(lab, ctrl, [1.025])
    rows = {e["id"]: e for e in json.loads(nightlab("results", "--json", cwd=lab.path).stdout)["experiments"]}
    assert rows[close.id]["verdict"] == "within-noise" and not rows[close.id]["earlier_figure"]
    assert rows[close.id]["judged"]["n"] == 4


def test_results_footnotes_only_the_rows_it_shows_and_names_each_re_run(lab):
    ctrl = _controller(lab)
    _base(lab, ctrl, [1.0, 1.01])
    starved = _base(lab, ctrl, [1.2, 1.3, 1.4], outcome="degraded")
    [again] = lab.submit("re-run of the first", seed=99, start_controller=False)
    lab.ledger.log_event("rerun", again.id, of=starved[0], worker="cpu-0")
    _run(lab, ctrl, {again.id: 1.5}, outcome="degraded")  # the re-run starved too: not re-run again
    [queued] = _candidate(lab, "0.02")
    said = nightlab("results", "--all", cwd=lab.path).stderr
    assert f"{starved[0]} " in said and f"re-run as {again.id} (degraded))" in said
    assert f"it is the re-run of {starved[0]}: not re-run again)" in said
    assert f"{starved[1]} " in said and "to be re-run once)" in said
    assert "; re-run once)" not in said
    table = nightlab("results", "-n", "1", cwd=lab.path)
    assert "not judged, not in any figure" not in table.stderr  # the one row shown is the best ok run
    # a queued run has no figure: nobody vouches for it yet
    rows = {e["id"]: e for e in json.loads(nightlab("results", "--json", cwd=lab.path).stdout)["experiments"]}
    assert rows[queued.id]["trust"] is None and rows[starved[0]]["trust"] == "self-reported"
    line = next(
        x for x in nightlab("results", "--all", cwd=lab.path).stdout.splitlines() if x.startswith(queued.id)
    )
    assert "self-reported" not in line


def test_progress_png_draws_within_noise_apart_and_counts_the_degraded_runs_it_leaves_out(lab, monkeypatch):
    from matplotlib.axes import Axes

    from nightlab.report import progress_png

    ctrl = _controller(lab)
    _base(lab, ctrl, [1.0])
    _base(lab, ctrl, [1.1, 1.2], outcome="degraded")
    [best] = _candidate(lab, "0.02")
    [worse] = _candidate(lab, "0.03")
    _run(lab, ctrl, {best.id: 0.9, worse.id: 1.1})
    drawn, titles, labels = {}, [], []
    monkeypatch.setattr(Axes, "scatter", lambda self, xs, ys, **k: drawn.setdefault(k.get("label"), list(xs)))
    monkeypatch.setattr(Axes, "set_title", lambda self, text, *a, **k: titles.append(text))
    monkeypatch.setattr(Axes, "annotate", lambda self, text, *a, **k: labels.append(text))
    progress_png(lab.ledger, lab.config, lab.path / "progress.png")
    seq = {e.id: e.seq for e in lab.ledger.experiments()}
    assert drawn["within noise (not settled)"] == [seq[best.id]]
    assert drawn["discarded"] == [seq[worse.id]]
    assert titles == [
        "tier cpu: 3 ok runs (3 self-reported), 1 kept snapshots; 2 degraded runs not drawn (starved or throttled: never judged)"
    ]
    # a forced adoption is named as one, never as "kept"
    nightlab("adopt", best.id, "--force", cwd=lab.path)
    labels.clear()
    progress_png(lab.ledger, lab.config, lab.path / "progress.png")
    assert labels == ["baseline", f"adopted {best.id} by force (within-noise): lr 0.02"]


def test_a_screened_search_wave_from_before_successive_halving_is_enrolled_when_resumed(lab, monkeypatch):
    """A `--screen-tier` wave submitted by an older nightlab has no successive-halving spec: the
    resumed loop enrols it and reviews its rung, instead of waiting for decisions that never come."""
    from nightlab import rungs

    ctrl = _controller(lab)
    key = {"strategy": "pattern", "spaces": [], "tier": "cpu", "screen_tier": "cpu"}
    wave = waves.submit_wave(
        lab,
        [{"LR": "0.019"}, {"LR": "0.03"}, {"LR": "0.005"}],
        design="search:pattern",
        description="screen",
        tier="cpu",
        search=(key, 0),
        source=Source.SEARCH,
        start_controller=False,
    )
    remeasure, a, b, c = wave.experiments
    _run(lab, ctrl, {remeasure.id: 1.0, a.id: 0.97, b.id: 1.2, c.id: 1.5})
    assert rungs.SPEC_KEY not in lab.ledger.wave(wave.wave.id).spec

    class _Stop(Exception):
        pass

    picked = []

    def promote(lab, ids, **_):
        picked.extend(ids)
        raise _Stop

    monkeypatch.setattr(waves, "promote", promote)
    plan = search_loop.SearchPlan("pattern", (), "cpu", "cpu", wave_size=3, top_k=3, repeats=2)
    with pytest.raises(_Stop):
        search_loop._LabLoop(lab, plan, [], poll=0.01, note=lambda _: None).promote(wave.wave.id)
    assert picked == [a.id]  # rank 1 of 4, the top quarter's cut-off is 1
    assert rungs.SPEC_KEY in lab.ledger.wave(wave.wave.id).spec
