"""Fixtures for the dashboard tests: one lab with finished, crashed, running and queued experiments.

`night_lab` (session, ~10 s) runs real experiments of the synthetic target through the
real CLI and fleet: a baseline, a better LR (adopted), a crash, one whose description and
knob value carry HTML/JS, a repeat of the adopted files and a 2 x 2 sweep (`nightlab sweep`). Then the fleet
is stopped and two running experiments and a queued one are written into the ledger the
way a controller writes them (lease, log path), with logs that print a training loss.
Nothing changes the ledger afterwards, so the tests can compare the dashboard with the
CLI's `--json` exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from labkit import SYNTHETIC_TRAIN, nightlab

XSS = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'
RUNNING_LOG = "step 00010 (10%) | loss: 3.500 | lr 0.04\rstep 00042 (42.5%) | loss: 2.750 | " + XSS + "\r"
SECOND_LOG = "warming up\nstep 5 loss=4.25\n"


@dataclass(frozen=True)
class NightLab:
    path: Path
    ids: dict[str, str]  # role -> experiment id
    wave: str
    running_log: Path

    def cli_json(self, *args: str) -> dict | list:
        return json.loads(nightlab(*args, "--json", cwd=self.path).stdout)


def _submit(lab: Path, message: str, *sets: str, extra: tuple[str, ...] = ()) -> str:
    args = ["submit", "-m", message, "--json", *extra]
    for s in sets:
        args += ["--set", s]
    return json.loads(nightlab(*args, cwd=lab).stdout)[0]["id"]


@pytest.fixture(scope="session")
def night_lab(tmp_path_factory: pytest.TempPathFactory) -> NightLab:
    from nightlab.lab import Lab

    base = tmp_path_factory.mktemp("web")
    target = base / "target"
    target.mkdir()
    (target / "train.py").write_text(SYNTHETIC_TRAIN)
    lab = base / "lab"
    nightlab("init", str(lab), "--target", str(target), "--cpu-slots", "2", cwd=base)
    ids = {
        "baseline": _submit(lab, "baseline"),
        "better": _submit(lab, "lr 0.02", "LR=0.02", "NOISE=0.01"),
        "crash": _submit(lab, "crash on purpose", 'MODE="crash"'),
        "xss": _submit(lab, "xss " + XSS, "LR=0.03", f"MODE={json.dumps(XSS)}"),
    }
    nightlab("wait", "--all", "--timeout", "60", cwd=lab)
    nightlab("adopt", ids["better"], "--force", cwd=lab)
    ids["repeat"] = _submit(lab, "repeat lr 0.02", extra=("--seed", "1"))
    sweep = json.loads(
        nightlab("sweep", "LR=0.015,0.04", "SLEEP=0.1,0.3", "-m", "LR x SLEEP", "--json", cwd=lab).stdout
    )
    for i, e in enumerate(sweep["experiments"]):
        ids[f"wave{i}"] = e["id"]
    nightlab("wait", "--all", "--timeout", "60", cwd=lab)
    nightlab("fleet", "stop", cwd=lab)

    with Lab.open(lab) as opened:
        for role, sleep in (("running", "300"), ("running2", "301"), ("queued", "302")):
            [e] = opened.submit(f"long run {role}", sets={"SLEEP": sleep}, start_controller=False)
            ids[role] = e.id
        ledger = opened.ledger
        ledger.register_workers([(f"cpu-{i}", "cpu", "local", {"threads": 1}) for i in range(2)])
        logs = {}
        for worker, text in (("cpu-0", RUNNING_LOG), ("cpu-1", SECOND_LOG)):
            attempt = ledger.lease_next(worker, "cpu")
            log = lab / ".nightlab" / "runs" / attempt.experiment_id / "log.txt"
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(text)
            ledger.update_attempt(attempt.id, log_path=str(log))
            logs[worker] = log
    return NightLab(lab, ids, sweep["wave"], logs["cpu-0"])


@pytest.fixture(scope="session")
def client(night_lab: NightLab):
    from fastapi.testclient import TestClient

    from nightlab.web.app import create_app

    with TestClient(create_app(night_lab.path)) as c:
        yield c
