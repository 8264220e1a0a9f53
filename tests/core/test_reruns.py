"""Waiting follows a degraded run to its re-run (`nightlab.reruns`): `nightlab wait` and the demo never stop at one."""

from __future__ import annotations

import threading
import time

from nightlab.ledger import Ledger, NewExperiment
from nightlab.reruns import Reruns


def new(i: int, description: str = "idea") -> NewExperiment:
    return NewExperiment(
        snapshot=f"c{i}", identity=f"t{i}", parent=None, description=description, tier="cpu", seed=i
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


def test_wait_for_all_waits_for_the_reruns_of_the_runs_that_end_degraded(make_lab):
    """Issue 32: `nightlab wait --all` returned while the re-run of a degraded run it saw was queued."""
    from labkit import nightlab
    from nightlab.lab import Lab

    with Lab.open(make_lab(slots=1)) as lab:
        [first] = lab.submit("idea", start_controller=False)
        db = lab.path / ".nightlab" / "ledger.db"
        steps: list[str] = []

        def controller() -> None:  # the controller's two steps, then the re-run's end
            with Ledger(db) as other:
                other.register_workers([("cpu-0", "cpu", "local", {})])
                time.sleep(0.3)
                other.finish_attempt(other.lease_next("cpu-0", "cpu").id, outcome="degraded")
                time.sleep(0.5)
                [again] = other.add_experiments([new(9, f"re-run of {first.id} (degraded)")])
                other.log_event("rerun", again.id, of=first.id, worker="cpu-0")
                time.sleep(0.5)
                steps.append("re-run ends")
                other.finish_attempt(
                    other.lease_next("cpu-0", "cpu").id, outcome="ok", metrics={"val_bpb": 1.0}
                )

        thread = threading.Thread(target=controller)
        thread.start()
        try:
            done = lab.wait(None, reruns=True, timeout=120)
        finally:
            thread.join()
        assert steps == ["re-run ends"]
        assert [(e.id, e.outcome) for e in done] == [(first.id, "degraded"), ("e0002", "ok")]
        # the CLI waits so too, and lists the re-run after the run it saw
        out = nightlab("wait", first.id, cwd=lab.path).stdout.splitlines()
        assert [line.split()[:2] for line in out] == [[first.id, "degraded"], ["e0002", "ok"]]
