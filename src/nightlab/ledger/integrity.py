"""Telling a damaged ledger from a busy one, with the command that fixes each.

SQLite reports damage as a handful of error strings; a user running `nightlab status` at
3 am must see one line that says what happened and what to run, never a traceback and
never a number read out of a broken page. Two kinds of damage matter:

- a corrupt page (`database disk image is malformed`, `file is not a database`): found when
  the page is read, by `PRAGMA quick_check` (the controller at start, every backup,
  `nightlab doctor`). Fix: `nightlab doctor --restore` (the newest good backup).
- a truncated WAL (`ledger.db-wal` cut short by a crash, a full disk or a bad copy).
  SQLite itself says nothing: it silently drops the cut transaction and every one after
  it, so a submission that got an id would vanish (measured: 49 of 50 committed rows
  visible after cutting 1,000 bytes off the WAL). `check_wal` compares the whole frames
  on disk with the count of committed frames in the wal-index, before SQLite opens the
  file (opening would "recover" and delete the evidence).
  Fix: `nightlab doctor --repair-wal` (keep what was committed before the cut) or
  `nightlab doctor --restore`.

stdlib only: the ledger imports this on every open.
"""

from __future__ import annotations

import os
import sqlite3
import struct
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from nightlab.errors import LedgerError

WAL_HEADER = 32
FRAME_HEADER = 24
_CORRUPT = ("malformed", "not a database", "file is encrypted", "disk image")
_FULL = ("database or disk is full", "disk is full", "no space left")
_IO = ("disk i/o error",)

T = TypeVar("T")
Hold = tuple[int, int] | None  # a ledger file's (device, inode), as `open_checked` counted it

# ledgers this process has a connection to, by (device, inode), and how many connections
_HELD: dict[tuple[int, int], int] = {}
_HELD_LOCK = threading.Lock()

RESTORE_HINT = (
    "run `nightlab doctor` for details, then `nightlab doctor --restore` to put the newest backup back"
)


def free_bytes(path: Path) -> int | None:
    """Free bytes for an unprivileged writer on the filesystem holding `path` (None if unknown)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def check_wal(db_path: Path) -> str | None:
    """None when `db_path`'s WAL holds every frame its wal-index says was committed; else a
    sentence saying how much is missing.

    A WAL whose length is off a frame boundary is not damage by itself: a writer killed
    between a frame's header and its page leaves that, and the half frame belongs to a
    transaction that never committed (measured: every SIGKILL-of-the-controller run leaves
    some). What is damage is fewer whole frames on disk than the wal-index (`-shm`, which
    the writer updates only after the frames are on disk) records as committed, for the
    same WAL generation (same salts). Without a `-shm` nothing can be told, and nothing is
    claimed.

    Nor in a process that has the ledger open already (`open_checked`): its WAL was checked when that
    connection opened, and SQLite has recovered it since; reading `-shm` here would also drop that
    connection's locks on it (closing any descriptor of a file drops all the process's POSIX locks
    on it), and the next process to open the ledger would then take itself for the first and
    truncate `-shm` under this one's mapping: the controller died of SIGBUS that way (CI, 2026-12-05).
    """
    if _key(db_path) in _HELD:
        return None
    wal = Path(str(db_path) + "-wal")
    shm = Path(str(db_path) + "-shm")
    try:
        # the index before the log: a writer puts frames on disk before the index counts them,
        # so a log read after its index holds at least what that index says; read the other
        # way round, a commit landing between the two reads looked like a cut log (seen under
        # load: a reader's open refused while the controller wrote)
        with open(shm, "rb") as f:
            index = f.read(96)
        with open(wal, "rb") as f:
            header = f.read(WAL_HEADER)
            size = f.seek(0, os.SEEK_END)
    except FileNotFoundError:
        return None
    if len(index) < 96 or index[:48] != index[48:96]:
        return None  # no index yet, or a writer is updating it right now (the two copies differ)
    committed = int.from_bytes(index[16:20], sys.byteorder)  # WalIndexHdr.mxFrame, native order
    if committed == 0:
        return None
    if len(header) < WAL_HEADER:
        return f"its write-ahead log `{wal.name}` lost its header ({size} bytes; {committed} frames were committed)"
    magic, _version, page_size = struct.unpack(">III", header[:12])
    if magic not in (0x377F0682, 0x377F0683) or header[16:24] != index[32:40]:
        return None  # another WAL generation than the index describes: SQLite rebuilds the index itself
    frames = (size - WAL_HEADER) // (FRAME_HEADER + page_size)
    if frames >= committed:
        return None
    return (
        f"its write-ahead log `{wal.name}` ends after {frames} whole frames but {committed} were committed "
        f"({size} bytes)"
    )


def _key(db_path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(db_path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def open_checked(db_path: Path, connect: Callable[[], T], *, check: bool = True) -> tuple[T, Hold]:
    """`connect()` to the ledger once its WAL passed `check_wal` (`LedgerError` when it was cut).

    Returns the connection and its hold: until `release(hold)`, this process counts as having
    the ledger open, and `check_wal` leaves its `-shm` alone. One opening at a time per process,
    so no check reads `-shm` while another thread's connection is being opened.
    """
    with _HELD_LOCK:
        problem = check_wal(db_path) if check else None
        if problem is not None:
            raise wal_error(db_path, problem)
        conn = connect()
        key = _key(db_path)  # the file exists once a connection is open
        if key is not None:
            _HELD[key] = _HELD.get(key, 0) + 1
        return conn, key


def release(hold: Hold) -> None:
    """The connection `open_checked` returned with `hold` was closed."""
    with _HELD_LOCK:
        if hold is not None and hold in _HELD:
            _HELD[hold] -= 1
            if _HELD[hold] <= 0:
                del _HELD[hold]


def wal_error(db_path: Path, problem: str) -> LedgerError:
    """The error a truncated WAL raises at open, naming both ways out."""
    return LedgerError(
        f"ledger `{db_path}` is damaged: {problem}, so its last transactions are lost; run "
        "`nightlab doctor --repair-wal` to keep everything committed before the cut, or "
        "`nightlab doctor --restore` to put the newest backup back"
    )


def explain(e: BaseException, db_path: Path, doing: str = "use") -> LedgerError:
    """Turn a `sqlite3.Error` into one actionable line (damage, full disk, I/O, or as is)."""
    text = str(e)
    low = text.lower()
    if any(k in low for k in _CORRUPT):
        return LedgerError(f"ledger `{db_path}` is damaged ({text}); {RESTORE_HINT}")
    free = free_bytes(Path(db_path).parent)
    # on a full disk SQLite often says only "disk I/O error" (it could not grow the -shm or -wal)
    if any(k in low for k in _FULL) or (any(k in low for k in _IO) and free is not None and free < 1 << 20):
        where = "" if free is None else f" ({free / 2**20:.1f} MiB free)"
        return LedgerError(
            f"the disk holding ledger `{db_path}` is full{where}: nothing was written; free some space "
            "and run the command again (`nightlab doctor` checks the disk)"
        )
    if any(k in low for k in _IO):
        return LedgerError(
            f"disk I/O error on ledger `{db_path}` ({text}); check the disk (`nightlab doctor`), "
            "the last committed state is intact"
        )
    return LedgerError(f"could not {doing} ledger `{db_path}`: {text}")


def quick_check(conn: sqlite3.Connection, *, full: bool = False) -> list[str]:
    """Problems `PRAGMA quick_check` (or `integrity_check` with `full`) finds; empty when ok."""
    pragma = "integrity_check" if full else "quick_check"
    try:
        rows = [r[0] for r in conn.execute(f"PRAGMA {pragma}(20)").fetchall()]
    except sqlite3.Error as e:
        return [str(e)]
    return [] if rows == ["ok"] else rows


def recover_wal(db_path: Path) -> tuple[list[str], int]:
    """Let SQLite recover what a cut WAL committed before the cut, then checkpoint it into the file.

    Returns:
        (what the full integrity check then finds wrong, the number of experiments kept).

    Raises:
        LedgerError: SQLite could not open or checkpoint the file.
    """
    try:
        conn = sqlite3.connect(db_path, isolation_level=None)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            problems = quick_check(conn, full=True)
            n = conn.execute("SELECT COUNT(*) FROM experiments").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise explain(e, db_path, "repair") from e
    return problems, n
