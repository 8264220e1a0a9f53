"""A screening rung's budget reaches the clock through the supervisor (issue 34), and only there.

The red-team lab's profile trains 8 s; a 1 s rung is `NIGHTLAB_TIER_BUDGET=1.0`, which the fleet
sets for a tier with `budget_seconds` (`nightlab.rungs.tier_budget_env`). One short run each."""

from __future__ import annotations

from redteam import edit, template

BATCHES = "batches = training_batches(profile, DEVICE_BATCH_SIZE, accel.device, seed=seed)"


def test_a_run_on_a_rung_trains_for_the_rungs_budget_and_records_it(attack):
    run = attack(template(), env={"NIGHTLAB_TIER_BUDGET": "1.0"})
    assert run.outcome == "ok", run.log[-2000:]
    assert run.metrics["budget_seconds"] == 1.0  # the harness's figure, not train.py's
    assert "budget 1s" in run.log  # what train.py's clock was given


def test_the_full_budget_set_by_a_run_on_a_rung_buys_nothing(attack):
    """Protection: the supervisor's batch server keeps the clock, on the tier's budget; the run's own
    `NIGHTLAB_BUDGET` changes nothing."""
    longer = "os.environ['NIGHTLAB_BUDGET'] = '8'\n" + BATCHES + "\nprint('clock budget', batches.budget)"
    run = attack(
        edit(template(), BATCHES, longer), env={"NIGHTLAB_TIER_BUDGET": "1.0", "NIGHTLAB_MAX_STEPS": ""}
    )
    assert "clock budget 1.0" in run.log, run.log[-2000:]
    assert run.outcome == "ok" and run.metrics["budget_seconds"] == 1.0, run.metrics
    assert run.metrics["training_seconds"] < 1.0 + 1.0, run.metrics  # one step past the budget at most


def test_a_tier_budget_longer_than_the_profiles_is_refused_in_one_line(attack):
    run = attack(template(), env={"NIGHTLAB_TIER_BUDGET": "9"})
    assert run.outcome != "ok" and run.metrics.get("val_bpb") is None
    [line] = [x for x in run.log.splitlines() if "NIGHTLAB_TIER_BUDGET" in x]
    assert line.startswith("nightlab harness: error: ") and "(0, 8]" in line and "budget_seconds" in line
