"""Downloads: parallel, retried with backoff, resumable, atomic and size-checked.

A file is fetched to `NAME.part` and renamed to `NAME` only once its size matches the
server's Content-Length and an optional content check (e.g. "is a parquet file") passed,
so a file with its final name is always complete. An interrupted `.part` file is resumed
with an HTTP Range request; a server that ignores Range makes it start over. Two processes
that want the same file serialise on `NAME.lock` and the second re-checks, finds the file,
and returns. The hub's base URL comes from `$NIGHTLAB_HUB_URL` (default
https://huggingface.co), which is how the tests serve files from 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nightlab.harness.cache import DataError

__all__ = ["OFFLINE_HINT", "download", "download_all", "hub_url"]

OFFLINE_HINT = "without network, make a lab with `--dataset demo` or `--dataset local:PATH`"
RETRIES = 5  # attempts after the first; with BACKOFF 1 s the waits are 1, 2, 4, 8, 16 s
BACKOFF = 1.0
TIMEOUT = 60.0  # seconds without a byte before a connection counts as dead
_CHUNK = 1 << 20


def hub_url() -> str:
    """Base URL of the dataset hub: `$NIGHTLAB_HUB_URL` or https://huggingface.co."""
    return os.environ.get("NIGHTLAB_HUB_URL", "https://huggingface.co").rstrip("/")


class _Incomplete(OSError):
    """The body ended before Content-Length bytes, or overran it."""


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no cross-process lock, the rename stays atomic
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _fetch(url: str, part: Path, on_bytes: Callable[[int], None]) -> None:
    """Fetch `url` into `part`, resuming from its current size when the server allows it."""
    start = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": "nightlab"}
    if start:
        headers["Range"] = f"bytes={start}-"
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT)
    except urllib.error.HTTPError as e:
        if e.code == 416:  # our partial file is not a prefix the server recognises: start over
            part.unlink(missing_ok=True)
        raise
    with resp:
        if start and resp.status != 206:
            start = 0  # the server ignored the Range header and sends the whole file
        length = resp.headers.get("Content-Length")
        expected = start + int(length) if length is not None else None
        with open(part, "ab" if start else "wb") as f:
            while chunk := resp.read(_CHUNK):
                f.write(chunk)
                on_bytes(len(chunk))
            f.flush()
            os.fsync(f.fileno())
    size = part.stat().st_size
    if expected is not None and size != expected:
        if size > expected:
            part.unlink()
        raise _Incomplete(f"got {size} bytes of {expected}")


def download(
    url: str,
    dest: Path,
    *,
    check: Callable[[Path], None] | None = None,
    on_bytes: Callable[[int], None] = lambda n: None,
    retries: int | None = None,
    backoff: float | None = None,
) -> Path:
    """Download `url` to `dest` unless `dest` exists (a complete file), atomically.

    Args:
        url: what to fetch.
        dest: the final path; `dest.part` holds the bytes until they are complete.
        check: raises `DataError` when the downloaded file's content is bad; the file is
            then discarded and fetched again.
        on_bytes: called with the size of every chunk received (for progress bars).
        retries: extra attempts after a failure (default `RETRIES`).
        backoff: first wait in seconds, doubled after every failure (default `BACKOFF`).

    Returns:
        `dest`.

    Raises:
        DataError: when every attempt failed, with the last reason and the offline hint.
    """
    retries = RETRIES if retries is None else retries
    backoff = BACKOFF if backoff is None else backoff
    dest = Path(dest)
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    with _file_lock(dest.with_name(dest.name + ".lock")):
        if dest.exists():  # another process finished it while we waited for the lock
            return dest
        last: Exception | None = None
        for attempt in range(retries + 1):
            if attempt:
                time.sleep(backoff * 2 ** (attempt - 1))
            try:
                _fetch(url, part, on_bytes)
                if check is not None:
                    try:
                        check(part)
                    except DataError:
                        part.unlink()
                        raise
                os.replace(part, dest)
                return dest
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    raise DataError(f"`{url}` does not exist on the server (HTTP 404)") from e
                last = e
            except urllib.error.URLError as e:
                if isinstance(e.reason, socket.gaierror):  # no DNS: offline, waiting will not help
                    raise DataError(f"cannot resolve the host of `{url}` ({e.reason}); {OFFLINE_HINT}") from e
                last = e
            except (OSError, http.client.HTTPException, DataError) as e:
                last = e
    raise DataError(f"could not download `{url}` after {retries + 1} attempts ({last}); {OFFLINE_HINT}")


def download_all(
    jobs: list[tuple[str, Path]],
    *,
    workers: int = 8,
    check: Callable[[Path], None] | None = None,
    on_bytes: Callable[[int], None] = lambda n: None,
    on_file: Callable[[Path], None] = lambda p: None,
) -> list[Path]:
    """Download many (url, dest) pairs on `workers` threads; the first failure is raised.

    Returns:
        The destinations, in the order of `jobs`.
    """

    def one(job: tuple[str, Path]) -> Path:
        path = download(job[0], job[1], check=check, on_bytes=on_bytes)
        on_file(path)
        return path

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(one, jobs))
