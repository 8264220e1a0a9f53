"""Ledger schema v6 (issue 33): the research identity's column `tree` is called `identity`.

The old ledgers here are written the way a nightlab of schema v5 wrote them: the shipped
`MIGRATIONS[:5]` (never edited once shipped) and rows inserted with v5's column names.
"""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
import threading

from nightlab.analysis import ResultRow
from nightlab.ledger import LEGACY_IDENTITY_KEY, MIGRATIONS, SCHEMA_VERSION, Ledger, _recover, backup

IDENTITY = "a" * 64
INCUMBENT = "b" * 64


def _v5_ledger(path) -> None:
    """A ledger file at schema v5 holding one finished, judged experiment and one queued one."""
    conn = sqlite3.connect(path)
    for script in MIGRATIONS[:5]:
        conn.executescript(script)
    conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', '5')")
    conn.execute("PRAGMA journal_mode = WAL")
    judged = json.dumps({"incumbent": "c" * 40, "tree": INCUMBENT, "mean": 1.25, "n": 3})
    rows = [
        ("e0001", 1, IDENTITY, 2, "ok", "keep", judged, 10.0),  # 2: FINISHED
        ("e0002", 2, IDENTITY, 0, None, None, None, None),  # 0: QUEUED
    ]
    for eid, seq, tree, status, outcome, verdict, judged_json, finished in rows:
        conn.execute(
            "INSERT INTO experiments (id, seq, snapshot, tree, parent, description, tier, seed, status,"
            " outcome, verdict, judged, submitted_at, finished_at, epoch)"
            " VALUES (?, ?, ?, ?, NULL, 'idea', 'cpu', ?, ?, ?, ?, ?, 1.0, ?, 'ep')",
            (eid, seq, "d" * 40, tree, seq, status, outcome, verdict, judged_json, finished),
        )
    conn.execute("INSERT INTO metrics (experiment_id, key, value) VALUES ('e0001', 'val_bpb', 1.2)")
    conn.commit()
    conn.close()


def _columns(path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {r[1] for r in conn.execute("PRAGMA table_info(experiments)")}
    finally:
        conn.close()


def test_a_v5_ledger_opens_migrated_once_with_the_identity_column(tmp_path):
    assert SCHEMA_VERSION == 6
    path = tmp_path / "ledger.db"
    _v5_ledger(path)
    with Ledger(path) as ledger:
        assert ledger.schema_version() == 6
        done, queued = ledger.experiments(identity=IDENTITY)
        assert (done.id, queued.id) == ("e0001", "e0002") and done.identity == IDENTITY
        assert done.judged == {"incumbent": "c" * 40, "identity": INCUMBENT, "mean": 1.25, "n": 3}
        [key, _] = ledger.rank_keys("val_bpb")
        assert (key.identity, key.judged_identity, key.judged_mean) == (IDENTITY, INCUMBENT, 1.25)
        assert ledger.seeds_used(IDENTITY, "cpu") == {1, 2}
        assert ledger.find_measured(IDENTITY, "cpu", 1).id == "e0001"
    assert "tree" not in _columns(path) and "identity" in _columns(path)
    [pre] = backup.list_backups(path)
    assert pre.path.name.endswith("-pre-v5.db") and "tree" in _columns(pre.path)  # the old one, as it was
    with Ledger(path) as ledger:  # the second open finds v6: no migration, no second backup
        assert [e.id for e in ledger.experiments(identity=IDENTITY)] == ["e0001", "e0002"]
    assert len(backup.list_backups(path)) == 1


def _open(path: str) -> int:
    with Ledger(path) as ledger:
        return ledger.schema_version()


def test_processes_opening_a_v5_ledger_at_once_migrate_it_once(tmp_path):
    # a second run of v6's migration would fail (`no such column: tree`): every open succeeding
    # is what says it ran once (the version is re-read inside the migration's write transaction)
    path = tmp_path / "ledger.db"
    _v5_ledger(path)
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        assert pool.map(_open, [str(path)] * 4) == [6] * 4
    with Ledger(path) as ledger:
        assert len(ledger.experiments(identity=IDENTITY)) == 2
    assert len(backup.list_backups(path)) == 1


def test_the_pre_migration_backup_is_taken_under_the_write_lock(tmp_path, monkeypatch):
    # outside it, processes opening at once each copied the ledger, and two copies begun in the
    # same millisecond shared a file name: one failed ("attempt to write a readonly database")
    path = tmp_path / "ledger.db"
    _v5_ledger(path)
    held = []
    real = backup.take_backup

    def spy(ledger_path, **kw):
        probe = sqlite3.connect(ledger_path, timeout=0)
        try:
            probe.execute("BEGIN IMMEDIATE")
            held.append(False)
        except sqlite3.OperationalError:  # "database is locked": the migrating open holds it
            held.append(True)
        finally:
            probe.close()
        return real(ledger_path, **kw)

    monkeypatch.setattr(backup, "take_backup", spy)
    with Ledger(path) as ledger:
        assert ledger.schema_version() == 6
    assert held == [True]


def test_two_backups_begun_in_the_same_millisecond_both_succeed(tmp_path, monkeypatch):
    path = tmp_path / "ledger.db"
    _v5_ledger(path)
    monkeypatch.setattr(backup, "_stamp", lambda now: "20270115T080000.123Z")
    real_check = backup.check_file
    inner = []

    def check_then_copy_again(p):
        # the first copy's file is written and not yet renamed: the second one starts now
        if not inner:
            inner.append(None)
            other = threading.Thread(target=lambda: inner.__setitem__(0, backup.take_backup(path)))
            other.start()
            other.join()
        return real_check(p)

    monkeypatch.setattr(backup, "check_file", check_then_copy_again)
    outer = backup.take_backup(path)
    assert outer == inner[0] and real_check(outer) is None
    assert [p.name for p in backup.backup_dir(path).iterdir()] == [outer.name]


def test_json_documents_keep_the_old_tree_key_beside_identity(tmp_path):
    path = tmp_path / "ledger.db"
    _v5_ledger(path)
    with Ledger(path) as ledger:
        e = ledger.get("e0001")
    d = e.to_dict()  # `show --json`
    assert LEGACY_IDENTITY_KEY == "tree"
    assert d["identity"] == d["tree"] == IDENTITY
    assert d["judged"]["identity"] == d["judged"]["tree"] == INCUMBENT
    row = ResultRow(e, 1.2, None).to_dict("val_bpb")  # a row of `results --json`
    assert row["judged"]["identity"] == row["judged"]["tree"] == INCUMBENT
    assert e.judged == {"incumbent": "c" * 40, "identity": INCUMBENT, "mean": 1.25, "n": 3}  # stored once


def test_a_damaged_v5_ledger_is_salvaged_under_v6_names(tmp_path):
    # `doctor --restore` reads a damaged ledger as it is (no migration runs on it) and writes
    # its rows into a restored ledger of this version: the old column must land as `identity`
    old = tmp_path / "damaged.db"
    _v5_ledger(old)
    salvage = _recover.read_damaged(old)
    rows = {r["id"]: r for r in salvage.rows["experiments"]}
    assert "tree" not in rows["e0001"] and rows["e0001"]["identity"] == IDENTITY
    assert json.loads(rows["e0001"]["judged"])["identity"] == INCUMBENT
    with Ledger(tmp_path / "restored.db", create=True) as ledger:
        ledger.recover(_recover.RecoveryPlan(experiments=list(rows.values())))
        restored = ledger.get("e0001")
    assert restored.identity == IDENTITY and restored.judged["identity"] == INCUMBENT


def test_a_noise_table_row_carries_identity_and_the_old_tree_key():
    from nightlab.waves import SnapshotFigure

    d = SnapshotFigure(IDENTITY, "cpu", 1.0, 0.01, 2, ("e0001", "e0002")).to_dict()  # `noise --json`
    assert d["identity"] == d["tree"] == IDENTITY
