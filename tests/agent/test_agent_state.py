"""The supervisor's state as a typed ledger record (`ledger.AgentRun`), changed in one transaction.

It was `.nightlab/agent/state.json`, a dict the supervisor rewrote whole: a second writer's
change between its read and its write was lost. Here two writers run at once (processes, and
a forced interleaving) and every change survives; an old lab's state.json is imported once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from dataclasses import replace

import pytest

from nightlab.agent.control import read_state, status
from nightlab.errors import NightlabError
from nightlab.ledger import AgentRun, AgentRunStatus, Ledger


def new_run(**fields) -> AgentRun:
    base = {
        "pid": 4242,
        "status": "running",
        "agent": "claude",
        "cli": "claude",
        "command": ("claude", "-p"),
        "limits": {"max_hours": 8, "max_cost": None},
        "started_at": 1000.0,
        "updated_at": 1000.0,
    }
    return AgentRun(**{**base, **fields})


@pytest.fixture
def ledger(tmp_path):
    (tmp_path / ".nightlab").mkdir()
    with Ledger(tmp_path / ".nightlab" / "ledger.db", create=True) as opened:
        yield opened


def test_the_record_round_trips_typed(ledger):
    assert ledger.agent_run() is None
    ledger.start_agent_run(new_run())
    run = ledger.update_agent_run(
        session=1,
        api={"since": 1001.0, "failures": 1, "next_try_at": 1031.0},
        restarts=[1002.0],
        add={"experiments_submitted": 2, "cost_usd": 0.25, "restarts_total": 1},
    )
    ledger.add_agent_session({"n": 1, "end": "exit 0", "cost_usd": 0.25})
    ledger.add_agent_session({"n": 2, "end": "stall", "cost_usd": None})
    run = ledger.agent_run()
    assert run.status is AgentRunStatus.RUNNING  # an enum from the row, not a bare string
    assert run.command == ("claude", "-p") and run.limits == {"max_hours": 8, "max_cost": None}
    assert run.experiments_submitted == 2 and run.restarts_total == 1 and run.cost_usd == 0.25
    assert run.api["failures"] == 1 and run.restarts == (1002.0,)
    assert [s["end"] for s in run.sessions] == ["exit 0", "stall"]
    as_json = run.to_dict()
    assert as_json["command"] == ["claude", "-p"] and isinstance(as_json["sessions"], list)
    json.dumps(as_json)  # the `agent status --json` document
    # a new run replaces the last one and its sessions
    ledger.start_agent_run(new_run(pid=4343, started_at=2000.0))
    run = ledger.agent_run()
    assert run.pid == 4343 and run.sessions == () and run.experiments_submitted == 0


def test_a_bad_field_name_is_refused_and_nothing_is_written(ledger):
    ledger.start_agent_run(new_run())
    with pytest.raises(ValueError, match="no_such_field"):
        ledger.update_agent_run(no_such_field=1)
    with pytest.raises(ValueError, match="status"):
        ledger.update_agent_run(add={"status": 1})  # only counters are added to
    assert ledger.agent_run() == replace(new_run())


def test_a_change_between_a_read_and_a_write_is_kept(ledger, tmp_path):
    """Writer A reads, writer B counts a submission, A writes: read-then-write loses B's count.

    The forced interleaving shows the old way losing the change, and the record's way keeping it.
    """
    ledger.start_agent_run(new_run())
    b_done = threading.Event()

    def writer_b() -> None:
        with Ledger(tmp_path / ".nightlab" / "ledger.db") as own:
            own.update_agent_run(add={"experiments_submitted": 1})
        b_done.set()

    # the old way: read the whole state, change it, write it all back
    read = ledger.agent_run()
    threading.Thread(target=writer_b).start()
    assert b_done.wait(10)
    ledger.start_agent_run(replace(read, cost_usd=read.cost_usd + 0.5))
    assert ledger.agent_run().experiments_submitted == 0  # B's submission is gone

    # the record's way: each writer's change is made inside its own transaction
    ledger.start_agent_run(new_run())
    b_done.clear()
    threading.Thread(target=writer_b).start()
    assert b_done.wait(10)
    run = ledger.update_agent_run(add={"cost_usd": 0.5})
    assert run.experiments_submitted == 1 and run.cost_usd == 0.5


WRITER = textwrap.dedent(
    """
    import sys
    from nightlab.ledger import Ledger
    path, role, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with Ledger(path) as ledger:
        for i in range(n):
            if role == "counter":
                ledger.update_agent_run(add={"experiments_submitted": 1}, last_activity=float(i))
            else:
                ledger.add_agent_session({"n": i, "end": "exit 0"})
                ledger.update_agent_run(add={"cost_usd": 0.01, "restarts_total": 1}, updated_at=float(i))
    """
)


def test_two_processes_writing_at_once_lose_nothing(ledger, tmp_path):
    ledger.start_agent_run(new_run())
    n = 60
    path = str(tmp_path / ".nightlab" / "ledger.db")
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, path, role, str(n)])
        for role in ("counter", "sessions")
    ]
    try:
        assert [w.wait(timeout=120) for w in writers] == [0, 0]
    finally:
        for w in writers:
            if w.poll() is None:
                w.kill()
                w.wait()
    run = ledger.agent_run()
    assert run.experiments_submitted == n and run.restarts_total == n
    assert run.cost_usd == pytest.approx(0.01 * n) and len(run.sessions) == n


def test_an_old_labs_state_json_is_imported_once(make_lab):
    lab = make_lab(slots=1)
    folder = lab / ".nightlab" / "agent"
    folder.mkdir(parents=True)
    old = {
        "pid": 999999,
        "status": "stopped",
        "agent": "codex",
        "cli": "codex",
        "command": ["codex", "exec"],
        "limits": {"max_hours": 1},
        "started_at": 1000.0,
        "updated_at": 1100.0,
        "experiments_submitted": 3,
        "sessions": [{"n": 1, "end": "exit 0", "started_at": 1000.0, "ended_at": 1050.0}],
        "cost_usd": 0.1,
        "stop_reason": "max-hours",
        "some_key_of_an_older_version": 1,
    }
    (folder / "state.json").write_text(json.dumps(old))
    state = read_state(lab)
    assert state["agent"] == "codex" and state["experiments_submitted"] == 3
    assert state["sessions"][0]["end"] == "exit 0" and state["stop_reason"] == "max-hours"
    assert not (folder / "state.json").exists() and (folder / "state.json.imported").is_file()
    with Ledger(lab / ".nightlab" / "ledger.db") as ledger:
        assert ledger.agent_run().cost_usd == 0.1
    assert status(lab)["status"] == "stopped"  # from the ledger now


def test_an_old_state_json_with_an_unknown_status_is_refused_by_name(make_lab):
    lab = make_lab(slots=1)
    folder = lab / ".nightlab" / "agent"
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps({"pid": 1, "status": "runing", "agent": "codex"}))
    with pytest.raises(NightlabError, match="unknown supervisor status `runing`; delete it"):
        read_state(lab)
    assert (folder / "state.json").is_file()  # nothing imported, nothing renamed
