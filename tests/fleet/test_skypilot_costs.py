"""Fleet time and cost accounting (`nightlab.fleet.costs`) on a hand-built ledger.

Event and attempt times are set exactly, so every figure is checked against arithmetic
done by hand. No SkyPilot needed.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from nightlab.fleet import costs
from nightlab.ledger import Ledger, NewExperiment

T0 = 1_000_000.0


def _event(ledger: Ledger, ts: float, kind: str, worker: str, **data) -> None:
    with ledger.transaction() as c:
        c.execute(
            "INSERT INTO events (ts, kind, experiment_id, worker, data) VALUES (?, ?, NULL, ?, ?)",
            (T0 + ts, kind, worker, json.dumps(data)),
        )


def _run(ledger: Ledger, worker: str, start: float, end: float, outcome: str, **metrics) -> str:
    (exp,) = ledger.add_experiments(
        [
            NewExperiment(
                snapshot="c" * 40, identity="t" * 40, parent=None, description=outcome, tier="h100", seed=0
            )
        ]
    )
    attempt = ledger.lease_next(worker, "h100")
    verdict = metrics.pop("verdict", None)
    ledger.finish_attempt(attempt.id, outcome=outcome, metrics=metrics, verdict=verdict)
    with ledger.transaction() as c:
        c.execute(
            "UPDATE attempts SET started_at = ?, ended_at = ? WHERE id = ?",
            (T0 + start, T0 + end, attempt.id),
        )
        c.execute("UPDATE experiments SET finished_at = ? WHERE id = ?", (T0 + end, exp.id))
    return exp.id


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "ledger.db", create=True) as led:
        led.register_workers([("w0", "h100", "skypilot", {}), ("w1", "h100", "skypilot", {})])
        # w0: launched at 0, up at 100 ($3.60/h), two runs, torn down at 1000
        _event(led, 0, "cluster-launch", "w0", cluster="nl-w0")
        _event(
            led,
            100,
            "cluster-up",
            "w0",
            cluster="nl-w0",
            hourly_price=3.6,
            gpu_name="NVIDIA H100",
            setup_seconds=100,
        )
        e1 = _run(led, "w0", 100, 400, "ok", training_seconds=300.0, val_bpb=1.0, verdict="keep")
        e2 = _run(led, "w0", 400, 450, "crash:exception")
        _event(led, 1000, "cluster-down", "w0", cluster="nl-w0")
        # w1: up at 60, preempted at 500, relaunched and up again at 560, one run, then
        # left alone with no controller: autostop (10 min) ends it 600 s after its last run
        _event(led, 0, "cluster-launch", "w1", cluster="nl-w1")
        _event(
            led,
            60,
            "cluster-up",
            "w1",
            cluster="nl-w1",
            hourly_price=1.8,
            setup_seconds=60,
            autostop_minutes=10,
        )
        _event(led, 500, "cluster-lost", "w1", cluster="nl-w1")
        _event(led, 500, "cluster-launch", "w1", cluster="nl-w1")
        _event(
            led,
            560,
            "cluster-up",
            "w1",
            cluster="nl-w1",
            hourly_price=1.8,
            setup_seconds=60,
            autostop_minutes=10,
        )
        e3 = _run(led, "w1", 560, 860, "ok", training_seconds=290.0, val_bpb=0.9, verdict="keep")
        led.ids = (e1, e2, e3)
        yield led


def test_worker_costs_by_hand(ledger):
    w0, w1 = costs.worker_costs(ledger, until=T0 + 2000)
    assert (w0.worker, w0.state, w0.gpu_name) == ("w0", "down", "NVIDIA H100")
    assert (w0.held_seconds, w0.setup_seconds, w0.busy_seconds, w0.training_seconds) == (1000, 100, 350, 300)
    assert w0.idle_seconds == 550
    assert w0.efficiency == pytest.approx(0.3)
    assert w0.cost == pytest.approx(1.0)
    # 500 s before the preemption + 560..1460 (the last run ended at 860, autostop 600 s)
    assert w1.state == "autostopped"
    assert w1.held_seconds == pytest.approx(500 + 960)
    assert w1.setup_seconds == 120
    assert w1.cost == pytest.approx(1460 * 1.8 / 3600)


def test_window_clips_to_since(ledger):
    w0, _ = costs.worker_costs(ledger, since=T0 + 100, until=T0 + 1000)
    assert (w0.held_seconds, w0.setup_seconds, w0.training_seconds) == (900, 0, 300)
    assert w0.efficiency == pytest.approx(300 / 900)


def test_cost_per_experiment_and_per_kept_improvement(ledger):
    e1, e2, e3 = ledger.ids
    per_exp = costs.attempt_costs(ledger)
    assert per_exp[e1] == pytest.approx(300 * 3.6 / 3600)
    assert per_exp[e2] == pytest.approx(50 * 3.6 / 3600)
    assert per_exp[e3] == pytest.approx(300 * 1.8 / 3600)
    summary = costs.cost_summary(ledger)
    total = summary["total_cost"]
    assert total == pytest.approx(1000 * 3.6 / 3600 + 1460 * 1.8 / 3600)  # w0 held 1000 s, w1 1460 s
    assert summary["kept"] == 2 and summary["experiments"] == 3
    assert summary["cost_per_kept"] == pytest.approx(total / 2)
    assert summary["cost_per_experiment"] == pytest.approx(total / 3)
    text = costs.cost_markdown(summary)
    assert "| w0 | nl-w0 | NVIDIA H100 | down | 3.60 |" in text
    assert f"${total:,.2f}" in text


def test_no_remote_workers_no_summary(tmp_path):
    with Ledger(tmp_path / "l.db", create=True) as led:
        assert costs.cost_summary(led) is None


def test_hourly_price_from_the_handle_or_the_pool():
    handle = SimpleNamespace(
        launched_nodes=2, launched_resources=SimpleNamespace(get_cost=lambda s: 4.0 * s / 3600)
    )
    assert costs.hourly_price(handle) == 8.0
    assert costs.hourly_price(handle, override=1.5) == 1.5
    assert costs.hourly_price(SimpleNamespace()) is None  # e.g. Kubernetes: no catalog price


def test_a_cluster_whose_setup_failed_bills_until_autostop(tmp_path):
    with Ledger(tmp_path / "l.db", create=True) as led:
        _event(led, 0, "cluster-launch", "w0", cluster="nl-w0")
        _event(led, 300, "cluster-failed", "w0", cluster="nl-w0", provisioned=True)
        _event(led, 1000, "cluster-launch", "w1", cluster="nl-w1")
        _event(led, 1001, "cluster-failed", "w1", cluster="nl-w1", provisioned=False)  # nothing came up
        w0, w1 = costs.worker_costs(led, until=T0 + 5000)
    assert (w0.state, w0.held_seconds) == ("failed", 300 + 600)  # idle from 300, default autostop 10 min
    assert (w1.state, w1.held_seconds) == ("failed", 1)


def test_busy_time_counts_overlapping_attempts_once():
    """A pipelined worker leases its next attempt while one runs: the overlap is not busy twice."""
    assert costs._union([(5.0, 9.0), (0.0, 4.0), (3.0, 6.0), (10.0, 11.0)]) == [(0.0, 9.0), (10.0, 11.0)]


def test_a_workers_state_is_the_enum_its_events_leave_and_reads_as_before(ledger):
    # issue 33: one home for the cluster words (`fleet/cluster_states.py`); the cost report's JSON
    # and table keep the same strings, the ledger keeps the same event kinds
    from nightlab.fleet.cluster_states import CLUSTER_EVENTS, BillingState, ClusterEvent, ClusterState

    assert [str(k) for k in CLUSTER_EVENTS] == [
        "cluster-launch", "cluster-up", "cluster-failed", "cluster-lost", "cluster-down"
    ]  # fmt: skip
    # the states the machine and the bill share are the machine's own words, not a second copy
    for shared in ("LAUNCHING", "UP", "FAILED", "DOWN"):
        assert BillingState[shared] == ClusterState[shared]
    assert {BillingState.after(k) for k in ClusterEvent} == set(BillingState) - {BillingState.AUTOSTOPPED}
    w0, w1 = costs.worker_costs(ledger, until=T0 + 2000)  # as in test_worker_costs_by_hand
    assert isinstance(w0.state, BillingState) and isinstance(w1.state, BillingState)
    assert json.loads(json.dumps([w0.to_dict()["state"], w1.to_dict()["state"]])) == ["down", "autostopped"]
