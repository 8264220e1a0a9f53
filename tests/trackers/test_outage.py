"""A tracker that is down, slow or raising never delays, fails or loses an experiment.

End to end with the real MLflow client: a tracking URI at a closed 127.0.0.1 port, and a SQLite
store that cannot be opened (its folder's name is taken by a file) until the test frees it:
every run is dispatched and recorded as without a tracker, `status` and `doctor` say what is
queued and why, and once the store can be written the backlog is sent. In process, with a fake
tracker against the real ledger: a tracker that raises is retried until it works and loses
nothing, says so once, and a tracker that blocks holds no ledger lock.
Run: `.venv/bin/python -m pytest tests/trackers/test_outage.py -q`
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from pathlib import Path

from readback import mlflow_runs, trackers_state, wait_sent

from labkit import nightlab, wait_json, wait_until
from nightlab.config import load_lab_config
from nightlab.ledger import ExperimentStatus, open_ledger
from nightlab.trackers import BaseTracker, _outbox, follow


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once it is closed


def _finished(lab: Path) -> list[str]:
    done = json.loads(nightlab("results", "--all", "--json", cwd=lab).stdout)["experiments"]
    return sorted(d["id"] for d in done if d["status"] == "finished")


def test_a_tracker_that_is_down_delays_nothing_and_its_backlog_is_sent_when_it_is_back(tracked_lab, tmp_path):
    lab = tracked_lab('[trackers.mlflow]\ntracking_uri = "sqlite:///store/mlflow.db"\nexperiment = "night"\n')
    (lab / "store").write_text("not a folder: the store cannot be opened\n")
    nightlab("submit", "-m", "baseline", "--repeats", "2", cwd=lab)
    nightlab("submit", "-m", "lr", "--set", "LR=0.02", cwd=lab)
    wait_json(lab, "--all", timeout=120)
    assert _finished(lab) == ["e0001", "e0002", "e0003"]  # the fleet ran everything meanwhile
    down = wait_until(
        lambda: (t := trackers_state(lab)["mlflow"])["error"] and t["queued"] == 3 and t, timeout=120
    )
    assert down["sent"] == 0 and down["failing_since"] is not None
    status = nightlab("status", cwd=lab).stdout
    assert "tracker mlflow: 0 run(s) sent, 3 queued" in status and "failing since" in status
    doctor = nightlab("doctor", "--json", cwd=lab, check=False)
    check = next(c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "tracker mlflow")
    assert doctor.returncode == 1 and not check["ok"] and "3 run(s) queued" in check["detail"]
    assert "nightlab export mlflow" in check["fix"]

    (lab / "store").unlink()  # the outage ends
    back = wait_sent(lab, "mlflow", 3)
    assert back["error"] is None
    runs = mlflow_runs(f"sqlite:///{lab}/store/mlflow.db", "night")
    assert sorted(r.info.run_name for r in runs.values() if r.info.run_name.startswith("e")) == _finished(lab)
    log = (lab / ".nightlab" / "trackers.log").read_text()
    assert log.count("finished runs are queued in the ledger") == 1  # said once, not once per retry


def test_an_unreachable_server_is_reported_and_an_export_to_it_fails_in_one_line(tracked_lab):
    port = _closed_port()
    lab = tracked_lab(f'[trackers.mlflow]\ntracking_uri = "http://127.0.0.1:{port}"\n')
    nightlab("submit", "-m", "baseline", "--repeats", "2", cwd=lab)
    wait_json(lab, "--all", timeout=120)
    assert _finished(lab) == ["e0001", "e0002"]
    down = wait_until(lambda: (t := trackers_state(lab)["mlflow"])["error"] and t, timeout=120)
    assert down["queued"] == 2 and down["sent"] == 0
    export = nightlab("export", "mlflow", cwd=lab, check=False)
    assert export.returncode == 1, export.stderr
    lines = export.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and lines[0].startswith("error: mlflow (mlflow:http://127.0.0.1:")
        and "run the export again" in lines[0]
    )


# ---------------------------------------------------------------------------- in process, a fake tracker


class FlakyTracker(BaseTracker):
    """Raises for the first `failures` calls, or blocks each send until `gate` is set."""

    name = "mlflow"
    key = "fake:flaky"

    def __init__(self, failures: int = 0, gate: threading.Event | None = None) -> None:
        self.failures, self.gate, self.runs, self.points = failures, gate, {}, []
        self.sending = threading.Event()

    def log_run(self, record, wave):
        self.sending.set()
        if self.gate is not None:
            self.gate.wait()
        if self.failures:
            self.failures -= 1
            raise ConnectionError("tracker down\nsecond line of a long error")
        self.runs[record.run_id] = record
        return record.run_id, None

    def log_incumbent(self, tier, metric, points, lab_id):
        self.points += points


def _lab_with_runs(make_lab, n: int) -> Path:
    lab = make_lab()
    nightlab("submit", "-m", "baseline", "--repeats", str(n), cwd=lab)
    wait_json(lab, "--all", timeout=120)
    nightlab("fleet", "stop", cwd=lab)
    return lab


def _follow(lab: Path, tracker: BaseTracker) -> tuple[threading.Thread, threading.Event]:
    stop = threading.Event()
    config = load_lab_config(lab).config
    thread = threading.Thread(
        target=follow, args=(lab, config, lambda: tracker, tracker.key, stop), kwargs={"poll": 0.05}
    )
    thread.start()
    return thread, stop


def test_a_raising_tracker_is_retried_until_it_works_and_loses_nothing(make_lab, monkeypatch, caplog):
    lab = _lab_with_runs(make_lab, 3)
    monkeypatch.setattr(_outbox, "RETRY_SECONDS", 0.05)
    tracker = FlakyTracker(failures=3)
    caplog.set_level(logging.INFO, logger="nightlab.trackers")
    thread, stop = _follow(lab, tracker)
    try:
        wait_until(lambda: len(tracker.runs) == 3, timeout=60)
        with open_ledger(lab) as ledger:
            wait_until(lambda: ledger.tracker_backlog(tracker.key) == 0, timeout=60)
            state = ledger.tracker_state(tracker.key)
            assert state.failures == 0 and state.error is None and state.failing_since is None
            assert ledger.tracker_sent_count(tracker.key) == 3
    finally:
        stop.set()
        thread.join(30)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "ConnectionError: tracker down" in warnings[0]  # once, first line only
    assert any("is back" in r.getMessage() for r in caplog.records)
    assert [p[1] for p in tracker.points] == ["e0001"]  # the incumbent's line: the baseline's entry


def test_a_blocked_tracker_holds_no_ledger_lock_and_sends_everything_once_released(make_lab):
    lab = _lab_with_runs(make_lab, 2)
    gate = threading.Event()
    tracker = FlakyTracker(gate=gate)
    thread, stop = _follow(lab, tracker)
    try:
        with open_ledger(lab) as ledger:
            assert tracker.sending.wait(60)  # it hangs in its first send
            ledger.log_event("probe")  # a write while the tracker hangs: it takes no lock while it sends
            assert ledger.tracker_backlog(tracker.key) == 2
            new = nightlab("submit", "-m", "while blocked", "--set", "LR=0.02", cwd=lab).stdout.split()[0]
            wait_json(lab, new, timeout=120)
            assert ledger.get(new).status == ExperimentStatus.FINISHED
            gate.set()
            wait_until(lambda: ledger.tracker_backlog(tracker.key) == 0, timeout=60)
        assert sorted(r.split("-")[1] for r in tracker.runs) == ["e0001", "e0002", new]
    finally:
        gate.set()
        stop.set()
        thread.join(30)
        nightlab("fleet", "stop", cwd=lab, check=False)
