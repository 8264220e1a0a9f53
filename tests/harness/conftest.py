"""Fixtures for the harness data tests: the cpu profile's prepared demo data, a fake dataset hub.

`cpu_data` prepares the real `cpu` profile (demo corpus, 1024-token BPE, token cache) once
per session, ~2 s. `hub` serves files from a temp folder on 127.0.0.1 with HTTP Range
support and scripted faults, and points `$NIGHTLAB_HUB_URL` at itself; download retries
wait only milliseconds in tests.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from nightlab.harness import download
from nightlab.harness.data import prepare
from nightlab.harness.profiles import fingerprint, get_profile


@pytest.fixture(scope="session")
def cpu_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `cpu` profile's data directory, prepared once per session (read-only for tests)."""
    profile = get_profile("cpu")
    root = tmp_path_factory.mktemp("nightlab-data")
    return prepare(profile, data_dir=root / fingerprint(profile), progress=False, workers=2)


class Hub:
    """A dataset hub on 127.0.0.1: GET /<path> serves `root/<path>`.

    `faults[path]` is a list of modes consumed one per request: `truncate` (announce the
    full length, send half, close), `500`, `garbage` (right length, wrong bytes).
    `ignore_range` makes it answer Range requests with the whole file.
    """

    def __init__(self, root: Path):
        self.root = root
        self.faults: dict[str, list[str]] = {}
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)
        self.ignore_range = False
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_GET(self):
                path = self.path.lstrip("/")
                rng = self.headers.get("Range")
                hub.requests.append((path, rng))
                file = hub.root / path
                if not file.is_file():
                    self.send_error(404)
                    return
                mode = hub.faults.get(path, []).pop(0) if hub.faults.get(path) else None
                if mode == "500":
                    self.send_error(500)
                    return
                body = file.read_bytes()
                if mode == "garbage":
                    body = bytes(len(body))
                start = 0
                if rng and not hub.ignore_range:
                    start = int(rng.removeprefix("bytes=").rstrip("-"))
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                if mode == "truncate":
                    self.wfile.write(body[start : start + (len(body) - start) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body[start:])

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True)
        self.thread.start()

    def add(self, path: str, data: bytes) -> Path:
        file = self.root / path
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(data)
        return file

    def count(self, path: str) -> int:
        return sum(1 for p, _ in self.requests if p == path)


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    server = Hub(tmp_path / "hub")
    monkeypatch.setenv("NIGHTLAB_HUB_URL", server.url)
    monkeypatch.setattr(download, "BACKOFF", 0.001)
    monkeypatch.setattr(download, "RETRIES", 2)
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture(autouse=True)
def _isolated_data_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test writes to ~/.cache: the default data root is a temp folder."""
    monkeypatch.setenv("NIGHTLAB_DATA_DIR", str(tmp_path / "data-root"))
