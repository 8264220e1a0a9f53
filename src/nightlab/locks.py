"""Single-instance locks that die with their process.

An exclusive `flock` on a file is held for the life of the owner (the fleet controller,
the agent supervisor). The kernel drops it when the process dies, however it dies, so a
stale lock can never block a restart and no pid file has to be trusted.
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO


@contextlib.contextmanager
def try_lock(path: Path, *, patience: float = 0.0) -> Iterator[IO[str] | None]:
    """Yield the open lock file while this process holds the lock, None when another holds it.

    `patience` retries for that many seconds: an owner that is starting must not give up
    because some status command was probing the lock at that instant.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+")  # noqa: SIM115 - held for the life of the lock
    deadline = time.time() + patience
    try:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.time() >= deadline:
                    yield None
                    return
                time.sleep(0.02)
        yield f
    finally:
        f.close()
