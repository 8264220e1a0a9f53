"""The controller SIGKILLed at random moments (>= 20 kills) during a 200-experiment wave on
8 slots, restarted each time by the next CLI call: every experiment ends exactly once, ok,
with its own result; nothing lost, no lease or lock left behind. A controller ended by a fatal
signal says where in its log.

The long variant (more kills, several seeds) is `bench/reliability.py`.
"""

from __future__ import annotations

import os
import signal

from labkit import wait_until
from nightlab.ledger import open_ledger
from nightlab.testing.reliability import controller_kill_wave, controller_pid, submit_many, wait_finished


def test_twenty_controller_kills_during_a_200_experiment_wave(tmp_path):
    r = controller_kill_wave(tmp_path, experiments=200, slots=8, kills=20, seed=1)
    assert r["kills"] >= 20
    assert r["restarts_by_cli"] >= 1  # `nightlab status` brought the controller back
    assert r["experiments"] == 200
    assert r["lost"] == [] and r["unrecorded"] == []
    assert r["duplicated"] == []
    assert r["outcomes"] == {"ok": 200}, r["outcomes"]
    assert r["wrong_metric"] == []
    for eid, e in r["by_id"].items():
        assert e["metric"] == float(f"1.{e['seed']:03d}"), (eid, e)  # its own result, no other run's
    assert r["open_attempts"] == 0
    assert r["integrity"] == []
    assert r["lock_free"] and r["leftover_processes"] == []


def test_a_controller_ended_by_a_fatal_signal_leaves_its_stack_in_its_log(fast_lab):
    # a SIGBUS in a ledger query ended a controller without a word in controller.log (CI,
    # 2026-12-05): the stack of every thread goes there now, and the next CLI call restarts it
    lab = fast_lab(slots=1)
    ids = submit_many(lab, 2, start=True)
    pid = wait_until(lambda: controller_pid(lab), timeout=60, what="a controller")
    with open_ledger(lab) as ledger:  # serving: past its imports, where it sets its handler up
        wait_until(lambda: ledger.events(kinds=["controller-start"]), timeout=60, what="its start")
    os.kill(pid, signal.SIGBUS)
    log = lab / ".nightlab" / "controller.log"
    wait_until(lambda: "Fatal Python error: Bus error" in log.read_text(), timeout=30, what="the stack")
    assert "nightlab/fleet/daemon.py" in log.read_text()
    wait_finished(lab, ids)
