"""Target processes that die, hang or stop mid-log, and a machine that "reboots" mid-wave.

Each ends with every experiment finished exactly once, in the class its fault deserves:
SIGKILL from outside -> `infra`, retried, then ok; SIGSTOP (a hang with no output) -> the
hard timeout kills the stopped group -> `timeout`; a log cut inside its summary block ->
`crash:no-summary` (exit 0) or `infra` then ok (killed while writing).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from nightlab.testing.reliability import (
    audit,
    lab_processes,
    lock_free,
    nightlab,
    reboot_wave,
    set_faults,
    submit_many,
    wait_finished,
)


def _target_pid(lab, eid: str, timeout: float = 30) -> int:
    """The pid of the target process (the `sh train.sh` under the wrapper) of a running experiment."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for pid in lab_processes(lab):
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if f"/runs/{eid}/" in cwd and b"sleep" in cmd:
                return pid
        time.sleep(0.05)
    raise AssertionError(f"no target process of {eid}")


def test_killed_stopped_and_half_written_targets(fast_lab):
    lab = fast_lab(slots=4, timeout=6, retries=2)
    ids = submit_many(lab, 5)
    killed, stopped, cut, cut_killed, fine = ids
    set_faults(lab, killed, "wait")  # attempt 1 waits to be killed, attempt 2 runs ok
    set_faults(lab, stopped, "hang")
    set_faults(lab, cut, "half")
    set_faults(lab, cut_killed, "halfkill")
    nightlab("fleet", "start", cwd=lab)
    os.kill(_target_pid(lab, killed), signal.SIGKILL)
    os.kill(_target_pid(lab, stopped), signal.SIGSTOP)
    wait_finished(lab, ids, timeout=120)
    r = audit(lab)
    by = r["by_id"]
    assert by[killed]["outcome"] == "ok" and [a[0] for a in by[killed]["attempts"]] == ["infra", "ok"]
    assert by[stopped]["outcome"] == "timeout" and len(by[stopped]["attempts"]) == 1
    assert by[cut]["outcome"] == "crash:no-summary", by[cut]
    assert by[cut]["metric"] is None  # half a block never yields a number
    assert [a[0] for a in by[cut_killed]["attempts"]] == ["infra", "ok"]
    assert by[fine]["outcome"] == "ok"
    assert r["duplicated"] == [] and r["lost"] == [] and r["open_attempts"] == 0
    nightlab("fleet", "stop", cwd=lab)
    assert lock_free(lab) and lab_processes(lab) == []  # the stopped group was killed, not left behind


def test_reboot_requeues_in_flight_runs_once(tmp_path):
    r = reboot_wave(tmp_path, experiments=12, slots=4, sleep=1.5)
    assert r["status_rc"] == 0, r["status_stderr"]
    assert "restarted it" in r["status_stderr"]
    assert len(r["in_flight"]) == 4
    for eid, e in r["by_id"].items():
        failures = [a[0] for a in e["attempts"]]
        if eid in r["in_flight"]:
            assert failures == ["infra", "ok"], (eid, e)  # requeued once
        else:
            assert failures == ["ok"], (eid, e)
    assert r["outcomes"] == {"ok": 12}
    assert r["duplicated"] == [] and r["lost"] == [] and r["open_attempts"] == 0
    assert r["lock_free"] and r["leftover_processes"] == []


def test_status_does_not_start_a_controller_that_was_stopped_on_purpose(fast_lab):
    lab = fast_lab(slots=1)
    [eid] = submit_many(lab, 1)  # --no-start
    nightlab("status", cwd=lab)
    assert json.loads(nightlab("status", "--json", cwd=lab).stdout)["controller"]["running"] is False
    nightlab("fleet", "start", cwd=lab)
    wait_finished(lab, [eid], revive=False)
