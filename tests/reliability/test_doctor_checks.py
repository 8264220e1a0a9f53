"""`nightlab doctor` on a machine that starves its runs (issue 32 item 7): it warns when other work
leaves the CPU slots too few cores, fails when more than a third of the recent runs were
`degraded`, and answers without importing torch when no GPU slot needs it (2.6 of its 2.7 s).

Run: `.venv/bin/python -m pytest tests/reliability/test_doctor_checks.py -q`
"""

from __future__ import annotations

import json
import subprocess
import sys

from nightlab import doctor
from nightlab.ledger import NewExperiment, open_ledger
from nightlab.testing.reliability import nightlab


def _by_name(report, name: str):
    return next(c for c in report.checks if c.name == name)


def test_load_from_other_work_is_a_warning_naming_the_fix(fast_lab, monkeypatch):
    lab = fast_lab(slots=1)
    monkeypatch.setattr(doctor.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    quiet = _by_name(doctor.run_checks(lab), "load")
    assert quiet.ok and not quiet.warning, quiet
    monkeypatch.setattr(doctor.os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    report = doctor.run_checks(lab)
    busy = _by_name(report, "load")
    assert busy.ok and busy.warning and "degraded" in busy.detail and "nightlab.toml" in busy.fix, busy
    assert busy.line().startswith("WARN  load: load 64.0 on ")
    assert busy not in report.problems  # the load moves: a warning, not an exit 1


def _finish(lab, outcomes: list[str]) -> None:
    with open_ledger(lab) as ledger:
        new = [
            NewExperiment(snapshot="0" * 40, identity="t", parent=None, description="x", tier="cpu", seed=i)
            for i in range(len(outcomes))
        ]
        ledger.add_experiments(new)
        for outcome in outcomes:
            attempt = ledger.lease_next("cpu-0", "cpu")
            ledger.finish_attempt(attempt.id, outcome=outcome)


def test_more_than_a_third_of_recent_runs_degraded_fails(fast_lab):
    lab = fast_lab(slots=1)
    _finish(lab, ["ok"] * 8 + ["degraded"] * 4)
    check = _by_name(doctor.run_checks(lab), "degraded runs")
    assert check.ok and check.detail == "4 of the last 12 runs degraded", check
    _finish(lab, ["degraded"])  # the newest 12: 5 degraded
    proc = nightlab("doctor", "--json", cwd=lab, check=False)
    assert proc.returncode == 1, proc.stdout  # (the rows' made-up snapshots fail their check too)
    check = next(c for c in json.loads(proc.stdout)["checks"] if c["name"] == "degraded runs")
    assert not check["ok"] and check["detail"].startswith("5 of the last 12 runs degraded"), check
    assert "slots / threads" in check["fix"]


def test_doctor_does_not_import_torch_without_gpu_slots(fast_lab):
    lab = fast_lab(slots=1)
    probe = (
        "import sys; from pathlib import Path; from nightlab import doctor; "
        "r = doctor.run_checks(Path(sys.argv[1])); "
        "print('torch' in sys.modules, next(c.detail for c in r.checks if c.name == 'torch'))"
    )
    out = subprocess.run([sys.executable, "-c", probe, str(lab)], capture_output=True, text=True, check=True)
    imported, detail = out.stdout.strip().split(" ", 1)
    assert imported == "False" and detail.startswith("torch ") and "no GPU slots" in detail, out.stdout
