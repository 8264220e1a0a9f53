"""The demo follows a degraded run to its re-run, so it never reports or leaves one behind."""

from __future__ import annotations

import threading

from nightlab.demo import Reruns
from nightlab.ledger import Ledger, NewExperiment


def new(i: int, description: str = "idea") -> NewExperiment:
    return NewExperiment(
        snapshot=f"c{i}", tree=f"t{i}", parent=None, description=description, tier="cpu", seed=i
    )


def test_reruns_waits_for_the_controllers_second_step(tmp_path):
    with Ledger(tmp_path / "ledger.db", create=True) as ledger:
        ledger.register_workers([("w0", "cpu", "local", {})])
        ledger.add_experiments([new(1), new(2)])
        for outcome in ("degraded", "ok"):
            ledger.finish_attempt(ledger.lease_next("w0", "cpu").id, outcome=outcome)
        follow = Reruns(ledger)

        def controller() -> None:  # queues the re-run a moment after the degraded end, as the controller does
            with Ledger(tmp_path / "ledger.db") as other:
                [again] = other.add_experiments([new(1, "re-run of e0001 (degraded)")])
                other.log_event("rerun", again.id, of="e0001", worker="w0")

        timer = threading.Timer(0.5, controller)
        timer.start()
        try:
            assert follow.of(ledger.experiments(), timeout=10) == ["e0003"]
        finally:
            timer.join()
        assert follow.of(ledger.experiments(), timeout=10) == []  # followed once
        # a degraded re-run gets no re-run of its own: the controller says so and nothing is waited for
        ledger.finish_attempt(ledger.lease_next("w0", "cpu").id, outcome="degraded")
        ledger.log_event("degraded-again", "e0003", worker="w0")
        assert follow.of(ledger.experiments(), timeout=10) == []
        assert follow.decided == {"e0001": "e0003", "e0003": None}


def test_reruns_gives_up_on_a_decision_that_never_comes(tmp_path):
    with Ledger(tmp_path / "ledger.db", create=True) as ledger:
        ledger.register_workers([("w0", "cpu", "local", {})])
        ledger.add_experiments([new(1)])
        ledger.finish_attempt(ledger.lease_next("w0", "cpu").id, outcome="degraded")
        assert Reruns(ledger).of(ledger.experiments(), timeout=0.3) == []
