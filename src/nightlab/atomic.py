"""Files that appear whole or not at all: write a hidden temporary beside the target, then rename.

`os.replace` within one folder is atomic on POSIX, so a reader (the dashboard, a second process,
a controller re-attaching after a crash) sees the old file or the new one, never half of either.
The temporary keeps the target's suffix (`.score.tmp.json`, `.progress.tmp.png`) so writers that
pick the format by extension (matplotlib's `savefig`) still do, and it is removed when writing
fails. `unique=True` puts the process and thread ids in its name, for files that several threads
or processes may write at once (each then renames its own complete copy; the last one wins).

stdlib only: workers and the controller's hot path use it.

    atomic_write_json(run_dir / "sky.json", data, unique=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp)
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def atomic_path(path: Path, *, unique: bool = False) -> Iterator[Path]:
    """A temporary path to write in full; renamed onto `path` when the block ends without error.

    Raises whatever the block raises, after removing the temporary.
    """
    tag = f".{os.getpid()}.{threading.get_ident()}" if unique else ""
    tmp = path.with_name(f".{path.stem}{tag}.tmp{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes, *, unique: bool = False, durable: bool = False) -> None:
    """Write `data` to `path` atomically (see the module docstring).

    `durable`: the data reaches the disk (fsync) before the rename, for files a power cut must not
    leave empty under their final name (the prepared data's manifests and secret).
    """
    with atomic_path(path, unique=unique) as tmp, open(tmp, "wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())


def atomic_write_text(path: Path, text: str, *, unique: bool = False) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    atomic_write_bytes(path, text.encode(), unique=unique)


def atomic_write_json(path: Path, data: Any, *, unique: bool = False, **dumps: Any) -> None:
    """Write `data` as JSON to `path` atomically; `dumps` are `json.dumps` options (indent, sort_keys)."""
    atomic_write_text(path, json.dumps(data, **dumps), unique=unique)
