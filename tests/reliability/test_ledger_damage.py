"""A damaged ledger is detected with one line naming the fix, never a traceback or a wrong
number; backups are taken online at a fixed interval and before a migration, and
`nightlab doctor --restore` / `--repair-wal` put the lab back.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from labkit import wait_until
from nightlab.ledger import backup
from nightlab.testing.reliability import controller_pid, nightlab, set_faults, submit_many, wait_finished


def _one_line_error(proc, *needles: str) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _run_once(lab, n: int = 3) -> list[str]:
    """Run a few experiments to the end: the controller takes its first backup at start."""
    ids = submit_many(lab, n, start=True)
    wait_finished(lab, ids)
    nightlab("fleet", "stop", cwd=lab)
    return ids


def _corrupt_table(lab, table: str = "experiments") -> None:
    db = lab / ".nightlab" / "ledger.db"
    conn = sqlite3.connect(db)
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    with open(db, "r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(os.urandom(page_size))


def test_corrupt_page_is_named_at_open_and_restore_puts_a_backup_back(fast_lab):
    lab = fast_lab(slots=2)
    ids = _run_once(lab)
    assert backup.list_backups(lab / ".nightlab" / "ledger.db"), "the controller took no backup"
    _corrupt_table(lab)
    for args in (("status",), ("results", "--json"), ("show", ids[0])):
        _one_line_error(nightlab(*args, cwd=lab, check=False), "is damaged", "nightlab doctor --restore")
    doctor = nightlab("doctor", cwd=lab, check=False)
    assert doctor.returncode == 1
    fail = [line for line in doctor.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fail) == 1 and "ledger" in fail[0] and "nightlab doctor --restore" in fail[0], doctor.stdout
    # a controller refuses to write on top of the damage
    started = nightlab("fleet", "start", cwd=lab, check=False)
    assert started.returncode == 1, started.stdout
    assert "exited at start" in started.stderr
    assert "integrity check" in (lab / ".nightlab" / "controller.log").read_text()
    restored = nightlab("doctor", "--restore", "--json", cwd=lab)
    info = json.loads(restored.stdout)
    assert info["experiments"] == len(ids) and os.path.exists(info["replaced"])
    results = json.loads(nightlab("results", "--all", "--json", cwd=lab).stdout)
    assert sorted(e["id"] for e in results["experiments"]) == ids
    assert "FAIL  ledger" not in nightlab("doctor", cwd=lab, check=False).stdout


WRITER = """
import sys, time
from nightlab.ledger import Ledger
ledger = Ledger(sys.argv[1])
for i in range(40):
    ledger.log_event("probe", None, i=i)
print("ready", flush=True)
time.sleep(600)
"""


def _kill_a_writer_mid_way(db) -> None:
    """A writer killed with committed frames still in the WAL (no checkpoint), as after a crash."""
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()


def test_truncated_wal_is_detected_and_repaired(fast_lab):
    lab = fast_lab(slots=1)
    db = lab / ".nightlab" / "ledger.db"
    _kill_a_writer_mid_way(db)
    wal = db.with_name("ledger.db-wal")
    size = wal.stat().st_size
    with open(wal, "r+b") as f:
        f.truncate(size - 3000)  # cut inside the last committed frames
    line = _one_line_error(nightlab("status", cwd=lab, check=False), "write-ahead log", "--repair-wal")
    assert "--restore" in line
    doctor = nightlab("doctor", "--json", cwd=lab, check=False)
    assert doctor.returncode == 1
    ledger_check = next(c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "ledger")
    assert ledger_check["fix"] == "nightlab doctor --repair-wal"
    nightlab("doctor", "--repair-wal", cwd=lab)
    assert not wal.exists() or wal.stat().st_size == 0
    nightlab("status", cwd=lab)
    from nightlab.ledger import open_ledger

    with open_ledger(lab) as ledger:
        probes = [e.data["i"] for e in ledger.events(kinds=["probe"])]
        assert ledger.check(full=True) == []
    assert probes == list(range(len(probes))) and 0 < len(probes) < 40  # the prefix before the cut


def test_a_writer_killed_mid_frame_is_not_damage(fast_lab):
    """A half frame at the end of the WAL belongs to an uncommitted transaction: no false alarm."""
    lab = fast_lab(slots=1)
    db = lab / ".nightlab" / "ledger.db"
    _kill_a_writer_mid_way(db)
    with open(db.with_name("ledger.db-wal"), "ab") as f:
        f.write(b"\0" * 1000)  # the header and part of a frame that never committed
    nightlab("status", cwd=lab)


def test_backups_at_a_fixed_interval_keep_the_last_few(fast_lab):
    lab = fast_lab(slots=1, sleep=1.0, backup_interval=1)
    toml = lab / "nightlab.toml"
    toml.write_text(toml.read_text().replace("backup_interval = 1", "backup_interval = 1\nbackups = 2"))
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "keep 2"], cwd=lab, check=True
    )
    ids = submit_many(lab, 5, start=True)
    seen: set[str] = set()
    deadline = time.time() + 60
    while time.time() < deadline and len(seen) < 3:
        seen |= {b.path.name for b in backup.list_backups(lab / ".nightlab" / "ledger.db")}
        time.sleep(0.1)
    assert len(seen) >= 3, seen  # one per second while the wave ran
    wait_finished(lab, ids)
    nightlab("fleet", "stop", cwd=lab)
    kept = backup.list_backups(lab / ".nightlab" / "ledger.db")
    assert 1 <= len(kept) <= 2
    for b in kept:
        assert backup.check_file(b.path) is None
        conn = sqlite3.connect(b.path)
        assert conn.execute("SELECT COUNT(*) FROM experiments").fetchone()[0] == 5
        conn.close()
    assert not list((lab / ".nightlab" / "backups").glob("*.tmp*"))


def test_a_backup_is_taken_before_a_migration(tmp_path, monkeypatch):
    from nightlab import ledger as ledger_mod
    from nightlab.ledger import _schema

    db = tmp_path / ".nightlab" / "ledger.db"
    db.parent.mkdir()
    with ledger_mod.Ledger(db, create=True) as ledger:
        ledger.log_event("before-migration")
    old = ledger_mod.SCHEMA_VERSION
    monkeypatch.setattr(_schema, "SCHEMA_VERSION", old + 1)
    monkeypatch.setattr(_schema, "MIGRATIONS", [*_schema.MIGRATIONS, "CREATE TABLE probe (x INTEGER)"])
    with ledger_mod.Ledger(db) as ledger:
        assert ledger.schema_version() == old + 1
    [pre] = backup.list_backups(db)
    assert pre.pre_migration and pre.path.name.endswith(f"-pre-v{old}.db")
    conn = sqlite3.connect(pre.path)
    version = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
    assert int(version) == old
    assert conn.execute("SELECT COUNT(*) FROM events WHERE kind = 'before-migration'").fetchone()[0] == 1
    conn.close()


def test_a_copy_killed_mid_way_is_swept_after_an_hour_and_one_in_progress_is_not(tmp_path):
    from nightlab import ledger as ledger_mod

    db = tmp_path / ".nightlab" / "ledger.db"
    db.parent.mkdir()
    with ledger_mod.Ledger(db, create=True) as ledger:
        ledger.log_event("one")
    folder = backup.backup_dir(db)
    folder.mkdir()
    # the names `atomic_path(unique=True)` gives a copy's temporary (pid, thread id)
    stale = folder / ".ledger-20261204T101010.123Z.41.42.tmp.db"
    fresh = folder / ".ledger-20261204T111010.123Z.43.44.tmp.db"
    stale.write_bytes(b"half a copy")
    fresh.write_bytes(b"a copy under way")
    hour_ago = time.time() - 3700
    os.utime(stale, (hour_ago, hour_ago))
    taken = backup.take_backup(db)
    assert not stale.exists()  # a process killed mid-copy leaves it; nothing else would remove it
    assert fresh.exists()  # another process may still be writing it
    assert [b.path for b in backup.list_backups(db)] == [taken]


def test_doctor_names_a_dead_controller_its_leases_and_missing_refs(fast_lab):
    lab = fast_lab(slots=2, sleep=30)
    ids = submit_many(lab, 3)
    nightlab("fleet", "start", cwd=lab)
    from nightlab.ledger import open_ledger

    def started() -> bool:
        with open_ledger(lab) as ledger:
            return len([a for a in ledger.open_attempts() if a.handle.get("pid")]) == 2

    wait_until(started, timeout=30, what="two attempts with their pids")
    os.kill(controller_pid(lab), signal.SIGKILL)
    subprocess.run(["git", "update-ref", "-d", f"refs/nightlab/{ids[2]}"], cwd=lab, check=True)
    proc = nightlab("doctor", cwd=lab, check=False)
    assert proc.returncode == 1
    fails = {
        line.split(":", 1)[0].split()[1]: line for line in proc.stdout.splitlines() if line.startswith("FAIL")
    }
    assert set(fails) == {"controller", "leases", "snapshots"}, proc.stdout
    assert fails["controller"].endswith("fix: `nightlab fleet start`")
    assert fails["leases"].endswith("fix: `nightlab fleet start`") and "2 run(s)" in fails["leases"]
    fix = fails["snapshots"].split("fix: `", 1)[1].rstrip("`")
    assert fix.startswith("git -C") and ids[2] in fix
    subprocess.run(fix.split(), check=True)
    nightlab("fleet", "start", cwd=lab)
    report = json.loads(nightlab("doctor", "--json", cwd=lab, check=False).stdout)
    assert report["ok"], [c for c in report["checks"] if not c["ok"]]
    assert {c["name"] for c in report["checks"]} >= {
        "git",
        "python",
        "torch",
        "disk (logs)",
        "ledger",
        "backups",
    }


def _submit(lab, message: str, seed: int, *, start: bool = True) -> str:
    args = ["submit", "-m", message, "--seed", str(seed), "--json"] + ([] if start else ["--no-start"])
    [e] = json.loads(nightlab(*args, cwd=lab).stdout)
    return e["id"]


def _status_of(lab, eid: str) -> str:
    from nightlab.ledger import open_ledger

    with open_ledger(lab) as ledger:
        return ledger.get(eid).status.label


def test_restore_recovers_what_the_lab_proves_and_never_reuses_an_id(fast_lab):
    """Issue 32: a backup of the lab's first hour put back after a night. Every later experiment
    comes back from its snapshot ref, run folder or the damaged ledger's readable tables; no finished
    run is queued again, the controller stopped on purpose stays stopped, and no id is handed out twice."""
    from nightlab.ledger import AgentRun, open_ledger

    lab = fast_lab(slots=1, sleep=2.0)
    db = lab / ".nightlab" / "ledger.db"
    first = _submit(lab, "first", 0)
    wait_finished(lab, [first])
    second = _submit(lab, "second", 1)
    wait_until(lambda: _status_of(lab, second) == "running", timeout=120, what=f"{second} running")
    # the controller's copy, taken mid-run: it holds the controller's row and a run in flight
    taken = backup.take_backup(db)
    wait_finished(lab, [second])
    later = [_submit(lab, "later", 2), _submit(lab, "later", 3)]
    set_faults(lab, "e0005", "half")
    broken = _submit(lab, "broken", 4)
    wait_finished(lab, [*later, broken])
    dropped = _submit(lab, "dropped", 5, start=False)
    nightlab("cancel", dropped, cwd=lab)
    with open_ledger(lab) as ledger:
        now = time.time()
        ledger.start_agent_run(AgentRun(1, "stopped", "claude", None, ("claude",), {}, now, now))
        ledger.add_agent_session({"n": 1, "ended": "ok"})
    nightlab("fleet", "stop", cwd=lab)
    orphan = lab / ".nightlab" / "runs" / "e0008" / "attempt-1"  # a run folder whose ref is gone
    orphan.mkdir(parents=True)
    old_ref = subprocess.run(
        ["git", "rev-parse", f"refs/nightlab/{dropped}"], cwd=lab, capture_output=True, text=True
    ).stdout.strip()
    _corrupt_table(lab)

    info = json.loads(nightlab("doctor", "--restore", "--from", str(taken), "--json", cwd=lab).stdout)
    assert os.path.exists(info["replaced"])
    assert info["experiments"] == 6 and info["reserved"] == ["e0008"], info
    assert info["finished"] == [second] and info["requeued"] == [], info
    recovered = {r["id"]: (r["status"], r["outcome"], r["from"]) for r in info["recovered"]}
    assert recovered == {
        later[0]: ("finished", "ok", "snapshot ref and run folder"),
        later[1]: ("finished", "ok", "snapshot ref and run folder"),
        broken: ("finished", "crash:no-summary", "snapshot ref and run folder"),
        dropped: ("cancelled", "cancelled", "snapshot ref"),
    }, info
    assert info["agent"] == "recovered from the damaged ledger"
    assert any("e0008" in line and "reserved" in line for line in info["lost"]), info["lost"]
    assert any(line.startswith(f"{dropped}:") for line in info["lost"]), info["lost"]

    results = {
        e["id"]: e for e in json.loads(nightlab("results", "--all", "--json", cwd=lab).stdout)["experiments"]
    }
    assert sorted(results) == [first, second, *later, broken, dropped]
    with open_ledger(lab) as ledger:
        rows = {e.id: e for e in ledger.experiments()}
        assert ledger.agent_run() is not None and ledger.agent_run().sessions == ({"n": 1, "ended": "ok"},)
    assert rows[second].status.label == "finished" and rows[second].outcome == "ok"  # not queued again
    assert rows[later[1]].seed == 3 and rows[later[1]].metrics["val_bpb"] == 1.003  # tier and seed kept
    assert rows[broken].outcome.startswith("crash:")
    assert rows[dropped].status.label == "cancelled"
    # the controller was stopped on purpose: `status` must not start one, nothing is queued
    state = json.loads(nightlab("status", "--json", cwd=lab).stdout)
    assert controller_pid(lab) is None and state["queued"] == [] and state["running"] == []
    # the next id is past every id a ref or run folder holds, and the old ref is untouched
    assert _submit(lab, "after the restore", 6, start=False) == "e0009"
    # restoring again reads the first restore's ledger (now the one moved aside) whole: all comes back
    proc = nightlab("doctor", "--restore", "--from", str(taken), cwd=lab)
    assert "damaged ledger is kept at" in proc.stderr, proc.stderr
    for eid in (*later, broken, dropped, "e0009"):
        assert f"recovered {eid} " in proc.stderr and "from its damaged ledger" in proc.stderr, proc.stderr
    assert (
        subprocess.run(
            ["git", "rev-parse", f"refs/nightlab/{dropped}"], cwd=lab, capture_output=True, text=True
        ).stdout.strip()
        == old_ref
    )


def test_ids_held_by_a_ref_or_a_run_folder_are_never_handed_out(fast_lab):
    """The allocator skips ids the ledger does not know but the lab's files hold (a ledger copied back by hand)."""
    lab = fast_lab(slots=1)
    subprocess.run(["git", "update-ref", "refs/nightlab/e0004", "HEAD"], cwd=lab, check=True)
    assert submit_many(lab, 1) == ["e0005"]
    (lab / ".nightlab" / "runs" / "e0011").mkdir(parents=True)
    assert submit_many(lab, 2) == ["e0012", "e0013"]


def _locks_held(path) -> list[str]:
    """This process's POSIX locks on `path`, as /proc/locks lists them."""
    inode = os.stat(path).st_ino
    with open("/proc/locks") as f:
        return [line for line in f if f":{inode} " in line and f" {os.getpid()} " in line]


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="Linux: reads /proc/locks")
def test_a_second_connection_in_one_process_leaves_the_first_ones_locks(tmp_path):
    # the controller opened a second ledger (a screening run's review), whose WAL check read and
    # closed `-shm`: closing any descriptor of a file drops every POSIX lock the process holds on
    # it, so the next CLI call took itself for the only reader, truncated `-shm`, and the
    # controller died of SIGBUS in its next query (CI, 2026-12-05)
    from nightlab.errors import LedgerError
    from nightlab.ledger import Ledger, ReadOnlyLedger

    path = tmp_path / "ledger.db"
    first = Ledger(path, create=True)
    first.log_event("one", None)
    shm = tmp_path / "ledger.db-shm"
    held = _locks_held(shm)
    assert held  # SQLite's read lock on `-shm`: it tells other processes the index is in use
    for other in (Ledger(path), ReadOnlyLedger(path)):
        assert _locks_held(shm) == held
        assert [e.kind for e in other.events()] == ["one"]
        other.close()
        assert _locks_held(shm) == held
    first.close()
    # with no connection left in this process, a cut WAL is found at the next open, as before
    _kill_a_writer_mid_way(path)
    wal = tmp_path / "ledger.db-wal"
    with open(wal, "r+b") as f:
        f.truncate(wal.stat().st_size - 3000)
    with pytest.raises(LedgerError, match="write-ahead log"):
        Ledger(path)
