"""The ledger contract: schema versions, atomic leases, attempts that end exactly once."""

from __future__ import annotations

import sqlite3

import pytest

from nightlab.errors import LedgerError
from nightlab.ledger import SCHEMA_VERSION, ExperimentStatus, Ledger, NewExperiment


def new(i: int = 0, **kw) -> NewExperiment:
    return NewExperiment(
        snapshot=f"c{i}", identity=f"t{i}", parent=None, description=f"idea {i}", tier="cpu", seed=0, **kw
    )


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "ledger.db", create=True) as led:
        led.register_workers([("w0", "cpu", "local", {}), ("w1", "cpu", "local", {})])
        yield led


def test_schema_is_created_in_wal_mode(ledger):
    assert ledger.schema_version() == SCHEMA_VERSION
    assert ledger._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_newer_schema_names_the_upgrade(tmp_path):
    path = tmp_path / "ledger.db"
    Ledger(path, create=True).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(LedgerError, match="pip install -U nightlab"):
        Ledger(path)


def test_missing_ledger(tmp_path):
    with pytest.raises(LedgerError, match="nightlab init"):
        Ledger(tmp_path / "none.db")


def test_ids_and_before_commit_rollback(ledger):
    [a, b] = ledger.add_experiments([new(1), new(2)])
    assert (a.id, b.id) == ("e0001", "e0002")

    def fail(_):
        raise RuntimeError("git failed")

    with pytest.raises(RuntimeError):
        ledger.add_experiments([new(3)], before_commit=fail)
    assert [e.id for e in ledger.experiments()] == ["e0001", "e0002"]
    [c] = ledger.add_experiments([new(4)])
    assert c.id == "e0003"


def test_lease_order_priority_then_submission(ledger):
    ledger.add_experiments([new(1), new(2), new(3, priority=5)])
    order = [ledger.lease_next("w0", "cpu").experiment_id for _ in range(3)]
    assert order == ["e0003", "e0001", "e0002"]
    assert ledger.lease_next("w0", "cpu") is None
    assert ledger.lease_next("w0", "gpu") is None


def test_an_attempt_ends_exactly_once(ledger):
    ledger.add_experiments([new(1)])
    att = ledger.lease_next("w0", "cpu")
    assert (
        ledger.finish_attempt(att.id, outcome="ok", metrics={"val_bpb": 1.5, "device": "cpu"}) == "finished"
    )
    assert ledger.finish_attempt(att.id, outcome="crash:exception") is None
    e = ledger.get("e0001")
    assert e.outcome == "ok" and e.metrics == {"val_bpb": 1.5, "device": "cpu"}


def test_infra_retries_until_the_limit(ledger):
    ledger.add_experiments([new(1)])
    for expected in ("queued", "queued", "finished"):
        att = ledger.lease_next("w0", "cpu")
        assert ledger.finish_attempt(att.id, outcome="infra", max_attempts=3) == expected
    e = ledger.get("e0001")
    assert e.status == ExperimentStatus.FINISHED and e.outcome == "infra" and e.attempts == 3


def test_a_superseded_attempt_cannot_finish(ledger):
    ledger.add_experiments([new(1)])
    first = ledger.lease_next("w0", "cpu")
    ledger.finish_attempt(first.id, outcome="infra", max_attempts=3)
    second = ledger.lease_next("w1", "cpu")
    # the first attempt's runner reports late: ignored
    assert ledger.finish_attempt(first.id, outcome="ok") is None
    assert ledger.finish_attempt(second.id, outcome="ok") == "finished"


def test_queued_infra_retries_name_the_worker_they_left_and_a_lease_can_be_limited_to_them(ledger):
    ledger.add_experiments([new(1), new(2), new(3)])
    first, second = ledger.lease_next("w0", "cpu"), ledger.lease_next("w0", "cpu")
    ledger.finish_attempt(first.id, outcome="infra", max_attempts=3)
    ledger.finish_attempt(second.id, outcome="crash:exception")
    assert ledger.infra_retries() == {"e0001": "w0"}  # queued, and its last attempt ended infra on w0
    assert ledger.lease_next("w1", "cpu", only=["e0003"]).experiment_id == "e0003"  # not the older e0001
    assert ledger.lease_next("w1", "cpu", only=[]) is None
    assert ledger.lease_next("w1", "cpu", only=["e0001"]).experiment_id == "e0001"
    assert ledger.infra_retries() == {}  # leased again


def test_cancel(ledger):
    ledger.add_experiments([new(1), new(2)])
    ledger.lease_next("w0", "cpu")
    assert ledger.request_cancel("e0002") == ExperimentStatus.CANCELLED
    assert ledger.request_cancel("e0001") == ExperimentStatus.RUNNING
    assert ledger.get("e0001").cancel_requested


def test_recent_wall_seconds_are_the_last_ok_runs_of_the_tier(ledger):
    ledger.add_experiments([new(i) for i in range(5)])
    walls = []
    for i, outcome in enumerate(["ok", "crash:exception", "ok", "ok", "ok"]):
        att = ledger.lease_next("w0", "cpu")
        ledger._conn.execute(
            "UPDATE experiments SET started_at = ? WHERE id = ?", (1000.0 * i, att.experiment_id)
        )
        ledger._conn.commit()
        ledger.finish_attempt(att.id, outcome=outcome)
        if outcome == "ok":
            e = ledger.get(att.experiment_id)
            walls.append(e.finished_at - e.started_at)
    assert ledger.recent_wall_seconds("cpu", 3) == walls[-3:]  # oldest first, the crash left out
    assert ledger.recent_wall_seconds("cpu", 10) == walls
    assert ledger.recent_wall_seconds("gpu", 10) == []
