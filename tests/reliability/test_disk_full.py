"""The disk filling up while the ledger or a log is written, on a small tmpfs mounted for the
test (needs root, as on the dev box and CI; skipped with the reason elsewhere).

Goals: a clear one-line message naming the fix, the ledger intact (integrity check, no row
lost or half-written), and the run requeued or failed honestly (`infra` with the disk in
its detail, never a `crash` of the code).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from labkit import wait_until
from nightlab.testing.reliability import (
    audit,
    make_fast_lab,
    nightlab,
    set_faults,
    stop_lab,
    submit_many,
    wait_finished,
)


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 24 MiB tmpfs at tmp_path/disk, unmounted afterwards (every lab process on it killed first)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip()}); run as root")
    labs: list[Path] = []
    try:
        yield mount, labs
    finally:
        for lab in labs:
            stop_lab(lab)
        for _ in range(50):
            if subprocess.run(["umount", str(mount)], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)


def _fill(path: Path) -> Path:
    """Write a filler file until the filesystem refuses (ENOSPC); returns it."""
    filler = path / "filler"
    # unbuffered: a buffered file keeps the bytes that did not fit and raises ENOSPC again at close,
    # or not, depending on how much room the lab left modulo the chunk size
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for chunk in (65536, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


def _intact(lab: Path) -> int:
    conn = sqlite3.connect(lab / ".nightlab" / "ledger.db")
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return conn.execute("SELECT COUNT(*) FROM experiments").fetchone()[0]
    finally:
        conn.close()


def test_full_disk_during_ledger_writes(small_disk):
    mount, labs = small_disk
    lab = make_fast_lab(mount, slots=1)
    labs.append(lab)
    [first] = submit_many(lab, 1)
    before = _intact(lab)
    filler = _fill(mount)
    failed = 0
    try:
        for args in (
            ("submit", "-m", "on a full disk", "--repeats", "30", "--no-start"),
            ("cancel", first),
            ("status",),
        ):
            proc = nightlab(*args, cwd=lab, check=False)
            if proc.returncode == 0:
                continue  # SQLite found room in pages it had already allocated: fine, and checked below
            failed += 1
            lines = [line for line in proc.stderr.splitlines() if line.strip()]
            assert proc.returncode == 1 and len(lines) == 1, proc.stderr
            assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
            assert "is full" in lines[0] or "No space left" in lines[0], lines[0]
            assert "free some space" in lines[0] or "No space left" in lines[0], lines[0]
    finally:
        filler.unlink()
    assert failed, "the full disk refused nothing: the test did not fill it"
    after = _intact(lab)
    assert after in (before, before + 30)  # all of a submission or none of it
    refs = subprocess.run(
        ["git", "for-each-ref", "refs/nightlab/"], cwd=lab, capture_output=True, text=True
    ).stdout
    ids = submit_many(lab, 2, message="after space was freed")
    assert len(ids) == 2 and _intact(lab) == after + 2
    assert len(refs.splitlines()) >= after


def test_full_disk_while_a_log_is_written(small_disk):
    mount, labs = small_disk
    lab = make_fast_lab(mount, slots=1, retries=2)
    labs.append(lab)
    [eid] = submit_many(lab, 1)
    set_faults(lab, eid, "big")  # attempt 1 writes 64 MiB of log into 24 MiB; attempt 2 is fine
    nightlab("fleet", "start", cwd=lab)
    run_dir = lab / ".nightlab" / "runs" / eid / "attempt-1"
    wait_until(  # the target ends (its log hit the full disk)
        lambda: (run_dir / "exit.tmp").exists() or (run_dir / "exit").exists(),
        timeout=60,
        interval=0.1,
        what="the end of attempt 1",
    )
    # the controller cannot record it on a full disk: it stops, and status brings it back
    proc = nightlab("status", cwd=lab, check=False)
    assert "Traceback" not in proc.stderr, proc.stderr
    # the user frees space (the runaway log), then looks at the lab again
    os.truncate(run_dir / "log.txt", 0)
    wait_finished(lab, [eid], timeout=120)
    r = audit(lab)
    failures = r["by_id"][eid]["attempts"]
    assert failures[0][0] == "infra", failures
    assert "disk" in (failures[0][1] or ""), failures
    assert r["by_id"][eid]["outcome"] == "ok" and [f for f, _ in failures] == ["infra", "ok"]
    assert r["integrity"] == [] and r["duplicated"] == [] and r["open_attempts"] == 0
    nightlab("fleet", "stop", cwd=lab)
