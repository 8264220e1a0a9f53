"""The controller SIGKILLed at random moments (>= 20 kills) during a 200-experiment wave on
8 slots, restarted each time by the next CLI call: every experiment ends exactly once, ok,
with its own result; nothing lost, no lease or lock left behind.

The long variant (more kills, several seeds) is `bench/reliability.py`.
"""

from __future__ import annotations

from nightlab.testing.reliability import controller_kill_wave


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
