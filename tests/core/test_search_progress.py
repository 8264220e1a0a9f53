"""The search progress record: a typed ledger row per `nightlab search` wave, changed in one transaction.

The concurrency test runs two real processes, each with its own `Ledger` connection to one file, that
change different fields of the same waves at the same moment (a barrier per wave). With the old
read-then-write (read the wave's spec, merge, write it back) the later write drops the earlier
one's field in most waves; `update_search_progress` reads and writes inside one `BEGIN IMMEDIATE`.

Run: .venv/bin/python -m pytest -q tests/core/test_search_progress.py
"""

from __future__ import annotations

import json
import multiprocessing
import sqlite3

import pytest

from nightlab.errors import LedgerError
from nightlab.ledger import SCHEMA_VERSION, Ledger, SearchProgress

KEY = {"strategy": "pattern", "spaces": ["LR=log(0.001,0.1)"], "tier": "cpu"}


def test_a_search_wave_starts_its_record_with_the_wave(tmp_path):
    with Ledger(tmp_path / "ledger.db", create=True) as ledger:
        plain = ledger.add_wave(design="full")
        wave = ledger.add_wave(design="search:pattern", search=(KEY, 0))
        assert ledger.search_progress(plain.id) is None
        assert ledger.search_progress(wave.id) == SearchProgress(wave.id, KEY, 0)
        other = ledger.add_wave(design="search:pattern", search=({**KEY, "strategy": "surface"}, 0))
        assert [p.wave_id for p in ledger.search_waves(KEY)] == [wave.id]
        assert [p.wave_id for p in ledger.search_waves()] == [wave.id, other.id]
        done = ledger.update_search_progress(wave.id, stepped=("e0001",), judged=True, adopted="e0001")
        assert done == ledger.search_progress(wave.id) and done.stepped == ("e0001",)
        assert ledger.update_search_progress(wave.id, settled=True).adopted == "e0001"


def test_a_judgement_is_final_and_fields_are_checked(tmp_path):
    with Ledger(tmp_path / "ledger.db", create=True) as ledger:
        wave = ledger.add_wave(design="search:pattern", search=(KEY, 0))
        ledger.update_search_progress(wave.id, judged=True, adopted=None, verdict="discard")
        with pytest.raises(LedgerError, match="judged already \\(discard\\); a judgement is final"):
            ledger.update_search_progress(wave.id, judged=True, adopted="e0002", verdict="keep")
        assert ledger.search_progress(wave.id).verdict == "discard"  # nothing half-written
        with pytest.raises(TypeError, match="no field verdit"):
            ledger.update_search_progress(wave.id, verdit="keep")


def _race(path, waves: list[str], fields: dict, barrier) -> None:
    """One writer: at each wave, wait for the other, then change its own field of that wave."""
    with Ledger(path) as ledger:
        for wave_id in waves:
            barrier.wait(timeout=30)
            ledger.update_search_progress(wave_id, **fields)


def test_two_concurrent_writers_both_land(tmp_path):
    path = tmp_path / "ledger.db"
    with Ledger(path, create=True) as ledger:
        waves = [ledger.add_wave(design="search:pattern", search=(KEY, i)).id for i in range(300)]
    ctx = multiprocessing.get_context("fork")  # no ledger connection is open here to inherit
    barrier = ctx.Barrier(2)
    writers = [
        ctx.Process(target=_race, args=(path, waves, fields, barrier))
        for fields in ({"promotion": "w999"}, {"settled": True})
    ]
    try:
        for p in writers:
            p.start()
        for p in writers:
            p.join(timeout=60)
        assert [p.exitcode for p in writers] == [0, 0]
    finally:
        for p in writers:
            if p.is_alive():
                p.kill()
                p.join()
    with Ledger(path) as ledger:
        lost = [p.wave_id for p in ledger.search_waves(KEY) if p.promotion != "w999" or not p.settled]
    assert lost == []


def test_a_v2_ledger_moves_its_search_state_out_of_the_spec(tmp_path):
    path = tmp_path / "ledger.db"
    with Ledger(path, create=True) as ledger:
        judged = ledger.add_wave(design="search:factorial", spec={"spaces": ["LR=0.01,0.02"]})
        pending = ledger.add_wave(design="search:factorial")
        sweep = ledger.add_wave(design="full", spec={"runs": []})
    # the same ledger as nightlab v2 wrote it: the progress in each wave's spec
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE search_waves")
    # v4's tables (issue 12, the agent's record) and v5's (issue 35, the experiment trackers)
    for later in ("agent_run", "agent_sessions", "trackers", "tracker_runs"):
        conn.execute(f"DROP TABLE {later}")
    # and v6's names (issue 33): the research identity's column was `tree`
    conn.execute("ALTER TABLE experiments RENAME COLUMN identity TO tree")
    conn.execute("DROP INDEX experiments_identity")
    conn.execute("CREATE INDEX experiments_tree ON experiments(tree, tier, seed)")
    conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    states = {
        judged.id: {
            "key": KEY,
            "index": 0,
            "judged": True,
            "adopted": "e0003",
            "verdict": "keep",
            "stepped": [],
        },
        pending.id: {"key": KEY, "index": 1, "judged": False, "promotion": None, "settled": True},
    }
    for wave_id, state in states.items():
        spec = {"spaces": ["LR=0.01,0.02"], "search": state}
        conn.execute("UPDATE waves SET spec = ? WHERE id = ?", (json.dumps(spec), wave_id))
    conn.commit()
    conn.close()
    with Ledger(path) as ledger:
        assert SCHEMA_VERSION >= 3 and ledger.schema_version() == SCHEMA_VERSION
        assert ledger.search_waves() == [
            SearchProgress(judged.id, KEY, 0, judged=True, adopted="e0003", verdict="keep", stepped=()),
            SearchProgress(pending.id, KEY, 1, settled=True),
        ]
        assert ledger.search_progress(sweep.id) is None
        assert ledger.wave(judged.id).spec == {"spaces": ["LR=0.01,0.02"]}  # one place for the state
