"""Rungs (issue 34): a tier's own budget, checked in nightlab.toml and by the harness's supervisor."""

from __future__ import annotations

import re

import pytest

from nightlab.config import parse_config
from nightlab.errors import ConfigError, UsageError

PROFILE = {
    "name": "cpu",
    "dataset": "demo",
    "vocab_size": 1024,
    "seq_len": 256,
    "budget_seconds": 30.0,
    "eval_tokens": 32768,
}


def doc(*pools, profile=PROFILE, search=None):
    d = {
        "target": {"command": "python train.py", "editable": ["train.py"], "builtin": profile is not None},
        "fleet": {"pool": list(pools)},
    }
    if profile is not None:
        d["profile"] = dict(profile)
    if search:
        d["search"] = search
    return d


FULL = {"backend": "local", "tier": "cpu", "slots": 1}
SHORT = {"backend": "local", "tier": "cpu-10s", "slots": 1, "budget_seconds": 10, "promote_to": "cpu"}


def test_a_tier_has_its_own_budget_and_the_next_rung():
    from nightlab import rungs

    cfg = parse_config(doc(FULL, SHORT))
    assert rungs.budget_of(cfg, "cpu-10s") == 10.0 and rungs.budget_of(cfg, "cpu") == 30.0
    assert rungs.next_rung(cfg, "cpu-10s") == "cpu" and rungs.next_rung(cfg, "cpu") is None
    assert rungs.screen_tier_for(cfg, "cpu") == "cpu-10s"
    assert rungs.tier_label(cfg, "cpu-10s") == "cpu-10s (10 s rung)"
    assert rungs.tier_budget_env(cfg, "cpu-10s") == "10.0"
    from nightlab.fleet.runner import max_training_seconds

    assert max_training_seconds(cfg, "cpu-10s") == 15.0 and max_training_seconds(cfg, "cpu") == 35.0
    assert parse_config(doc(FULL, SHORT, search={"eta": 4})).search.eta == 4
    # a lab without rungs shows its tiers as before
    plain = parse_config(doc(FULL))
    assert rungs.tier_label(plain, "cpu") == "cpu" and not rungs.has_rungs(plain)
    with pytest.raises(UsageError, match=r'promote_to = "cpu"'):
        rungs.screen_tier_for(plain, "cpu")


@pytest.mark.parametrize(
    ("pools", "profile", "search", "says"),
    [
        (
            [FULL, {**SHORT, "budget_seconds": 0}],
            PROFILE,
            None,
            "`fleet.pool[1].budget_seconds` must be a positive",
        ),
        (
            [FULL, {**SHORT, "budget_seconds": "10"}],
            PROFILE,
            None,
            "`fleet.pool[1].budget_seconds` must be an integer or a number",
        ),
        ([FULL, {**SHORT, "budget_seconds": 60}], PROFILE, None, "more than the profile's 30 s"),
        ([FULL, {**SHORT, "promote_to": "h100"}], PROFILE, None, "not another tier; tiers: cpu, cpu-10s"),
        (
            [{**FULL, "promote_to": "cpu-10s"}, SHORT],
            PROFILE,
            None,
            "the next rung must have a longer budget",
        ),
        ([FULL, SHORT, {**SHORT, "budget_seconds": 5}], PROFILE, None, "disagree on `budget_seconds`"),
        ([FULL, SHORT], None, None, "only the built-in target's clock obeys"),
        ([FULL, SHORT], PROFILE, {"eta": 1}, "`search.eta` must be at least 2"),
    ],
)
def test_bad_rungs_are_one_line_errors_with_the_fix(pools, profile, search, says):
    with pytest.raises(ConfigError) as err:
        parse_config(doc(*pools, profile=profile, search=search))
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_skypilot_pool_keeps_rung_keys_out_of_its_task_options():
    sky = {"backend": "skypilot", "tier": "h100-60s", "accelerators": "H100:1", "budget_seconds": 10}
    cfg = parse_config(doc(FULL, sky))
    pool = next(p for p in cfg.fleet.pools if p.tier == "h100-60s")
    assert pool.budget_seconds == 10.0 and "budget_seconds" not in pool.options


def test_the_supervisor_takes_the_tier_budget_and_refuses_a_bad_one(monkeypatch):
    from nightlab.harness.attempt import tier_budget

    monkeypatch.delenv("NIGHTLAB_TIER_BUDGET", raising=False)
    assert tier_budget(30.0) == 30.0
    monkeypatch.setenv("NIGHTLAB_TIER_BUDGET", "10.0")
    assert tier_budget(30.0) == 10.0
    for bad in ("60", "0", "soon", "nan"):
        monkeypatch.setenv("NIGHTLAB_TIER_BUDGET", bad)
        with pytest.raises(UsageError, match=re.escape("fix the tier's `budget_seconds`")):
            tier_budget(30.0)


def test_the_controller_hands_each_run_its_tier_budget(tmp_path):
    """The budget travels as NIGHTLAB_TIER_BUDGET in the run's environment, local and remote alike."""
    from nightlab import rungs
    from nightlab.fleet.local import MEASUREMENT_OVERRIDES

    cfg = parse_config(doc(FULL, SHORT))
    assert {t: rungs.tier_budget_env(cfg, t) for t in cfg.fleet.tiers} == {"cpu": "30.0", "cpu-10s": "10.0"}
    # whoever starts the controller with one in their environment never sets a run's budget
    assert rungs.BUDGET_ENV in MEASUREMENT_OVERRIDES


def test_rank_transfer_reports_rho_its_interval_and_when_screening_misleads():
    from nightlab.rungs import rank_transfer

    few = rank_transfer([(1.0, 1.1), (1.2, 1.3), (1.1, 1.2)])
    assert few["rho"] == pytest.approx(1.0) and few["interval"] is None and "unmeasured" in few["warning"]
    good = rank_transfer([(x, x + 0.1) for x in (1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9)])
    assert good["rho"] == pytest.approx(1.0) and good["interval"][0] > 0.5 and good["warning"] is None
    # short runs that rank the snapshots backwards: the screen misleads
    backwards = rank_transfer([(x, 3.0 - x) for x in (1.0, 1.1, 1.2, 1.3, 1.4, 1.5)])
    assert (
        backwards["rho"] == pytest.approx(-1.0)
        and backwards["interval"][1] < 0
        and "rho -1.00" in backwards["warning"]
    )
    # a weak positive rho whose interval includes 0 is a warning too
    weak = rank_transfer([(1, 2), (2, 1), (3, 4), (4, 3), (5, 6), (6, 5)])
    assert 0 < weak["rho"] < 1 and weak["interval"][0] <= 0 and weak["warning"]


def test_the_controllers_run_spec_carries_the_tier_budget(make_lab):
    """`Controller._spec`: a built-in run on a rung gets its tier's budget in its environment."""
    from nightlab.fleet.controller import Controller
    from nightlab.lab import Lab
    from nightlab.rungs import BUDGET_ENV

    cfg = parse_config(doc({**SHORT, "tier": "cpu", "promote_to": "full"}, {**FULL, "tier": "full"}))
    with Lab.open(make_lab(slots=1)) as lab:
        [e] = lab.submit("x", start_controller=False)
        attempt = lab.ledger.lease_next("cpu-0", "cpu")
        ctrl = Controller(lab.path, cfg, lab.ledger, slots=[], backends={}, policy=lab.judge())
        spec = ctrl._spec(attempt)
        assert attempt.experiment_id == e.id and spec.env[BUDGET_ENV] == "10.0"
        assert "nightlab.harness.attempt" in spec.command  # the supervisor reads it, not train.py


def test_a_rung_whose_compile_ran_past_the_warm_up_cap_is_warned_about(tmp_path, capsys):
    """The H200 (bench/RESULTS.md): a cold compile outlasted a short budget's warm-up cap and ate
    its timed training; `nightlab rungs` says so for every screening rung where a run's warm-up
    was ended by the cap, with or without promotions."""
    from types import SimpleNamespace

    from nightlab import rungs
    from nightlab.ledger import Ledger, NewExperiment

    cfg = parse_config(doc(FULL, SHORT))  # cpu-10s (cap 2.5 s) promotes to cpu (30 s, cap 7.5 s)

    def run(ledger, i, tier, warmup, budget, outcome="ok"):
        [e] = ledger.add_experiments(
            [
                NewExperiment(
                    snapshot=f"c{i}", identity=f"t{i}", parent=None, description="x", tier=tier, seed=i
                )
            ]
        )
        metrics = {"val_bpb": 1.0, "warmup_seconds": warmup, "budget_seconds": budget}
        ledger.finish_attempt(ledger.lease_next(f"{tier}-0", tier).id, outcome=outcome, metrics=metrics)

    with Ledger(tmp_path / "ledger.db", create=True) as ledger:
        ledger.register_workers([("cpu-10s-0", "cpu-10s", "local", {}), ("cpu-0", "cpu", "local", {})])
        lab = SimpleNamespace(config=cfg, ledger=ledger, path=tmp_path)
        run(ledger, 1, "cpu-10s", 0.4, 10.0)  # warm-up ended by its first steps
        assert rungs.warmup_capped(lab) == {
            "cpu-10s": {"runs": 1, "capped": 0, "cap_seconds": 2.5, "warning": None}
        }
        run(ledger, 2, "cpu-10s", 2.5, 10.0)  # ended by the cap: the compile ran into the budget
        run(ledger, 3, "cpu-10s", 2.5, 5.0)  # recorded at another budget: another rung's run
        run(ledger, 4, "cpu-10s", 2.5, 10.0, outcome="crash:exception")  # not an ok run
        run(ledger, 5, "cpu", 7.5, 30.0)  # the last rung judges with two runs a side: not reported
        report = rungs.warmup_capped(lab)
        assert list(report) == ["cpu-10s"] and (report["cpu-10s"]["runs"], report["cpu-10s"]["capped"]) == (
            2,
            1,
        )
        assert report["cpu-10s"]["warning"].startswith(
            "1 of 2 ok runs on cpu-10s (10 s) hit the untimed warm-up's cap of 2.5 s"
        )
        # no promotion yet: the rung still gets its row, with no rank correlation
        [row] = rungs.transfer(lab)
        assert (row["rung"], row["next"], row["n"], row["rho"]) == ("cpu-10s", "cpu", 0, None)
        assert row["warmup"] == report["cpu-10s"]
        # and `nightlab rungs` prints it, beside the line that there is nothing to correlate yet
        from nightlab.cli.rungs import command

        command.callback.__wrapped__(lab=lab, as_json=False)
        out = capsys.readouterr()
        assert out.out == "" and out.err.splitlines()[0].startswith("no promoted runs yet")
        assert out.err.splitlines()[1] == f"warning: {report['cpu-10s']['warning']}"


def test_the_standings_place_each_snapshot_as_a_sort_of_the_means_would():
    # `review` asks where each candidate stood when its run ended, for thousands of candidates on
    # a long night; `_Standings` answers with a bisection where the review used to sort every
    # snapshot's mean per candidate. Same answer, ties and the incumbent included
    import math
    import random

    from nightlab.rungs import _means, _Standings

    rng = random.Random(7)
    who = [f"{i:02x}" for i in range(12)]
    for sign in (1.0, -1.0):
        # coarse values and shared end times: equal means and simultaneous ends are common
        runs = [
            (rng.choice(who), rng.choice((1.0, 1.5, 2.0, 2.5)), float(rng.randrange(20))) for _ in range(60)
        ]
        runs += [(rng.choice(who), 1.25, math.inf) for _ in range(3)]  # no end time recorded
        board = _Standings(runs, sign, who[0])
        for until in sorted({end for _, _, end in runs}):
            board.advance(until)
            means = _means(runs, until=until)
            order = sorted(means, key=lambda t: sign * means[t])
            for t in who:
                expected = None
                if t in means:
                    behind = who[0] in means and sign * means[who[0]] <= sign * means[t]
                    expected = (order.index(t) + 1, len(order), behind)
                assert board.place(t) == expected, (sign, until, t)
