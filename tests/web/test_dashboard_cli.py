"""`nightlab dashboard`: binding rules, the token, and a real server answering on 127.0.0.1.

Run: .venv/bin/python -m pytest -q tests/web/test_dashboard_cli.py
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from nightlab.cli.dashboard import is_loopback


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(lab: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nightlab", "dashboard", *args],
        cwd=lab,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _serve(lab: Path, *args: str):
    """Start the dashboard; return the process once it answers (the caller terminates it)."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nightlab", "dashboard", "--port", str(port), *args],
        cwd=lab,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"dashboard exited {proc.returncode}: {proc.stderr.read()}")
        try:
            httpx.get(base + "/static/dashboard.css", timeout=1)
            return proc, base
        except httpx.TransportError:
            time.sleep(0.1)
    proc.terminate()
    raise AssertionError("dashboard did not start in 30 s")


@pytest.mark.parametrize(("host", "loopback"), [("127.0.0.1", True), ("localhost", True), ("::1", True),
                                                  ("127.0.0.2", True), ("0.0.0.0", False), ("::", False),
                                                  ("192.168.1.5", False), ("myhost", False)])  # fmt: skip
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_public_host_needs_a_token(make_lab):
    lab = make_lab(slots=1)
    proc = _run(lab, "--host", "0.0.0.0")
    assert proc.returncode == 2, proc.stderr
    assert "warning: `--host 0.0.0.0`" in proc.stderr and "`--token" in proc.stderr
    short = _run(lab, "--host", "0.0.0.0", "--token", "abc")
    assert short.returncode == 2 and "too short" in short.stderr


def test_outside_a_lab(tmp_path):
    proc = _run(tmp_path)
    assert proc.returncode == 2 and "not inside a nightlab lab" in proc.stderr


def test_serves_on_loopback(make_lab):
    lab = make_lab(slots=1)
    proc, base = _serve(lab)
    try:
        overview = httpx.get(base + "/api/overview", timeout=10)
        assert overview.status_code == 200 and overview.json()["counts"]["done"] == 0
        assert "no finished ok experiment yet" in httpx.get(base + "/", timeout=10).text
        assert httpx.get(base + "/", headers={"Host": "evil.example"}, timeout=10).status_code == 400
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_public_host_with_token(make_lab):
    lab = make_lab(slots=1)
    proc, base = _serve(lab, "--host", "0.0.0.0", "--token", "tok-123456789")
    try:
        assert httpx.get(base + "/api/overview", timeout=10).status_code == 401
        ok = httpx.get(base + "/api/overview", params={"token": "tok-123456789"}, timeout=10)
        assert ok.status_code == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert "warning: `--host 0.0.0.0` serves the lab" in err
