"""Downloads against a local HTTP server on 127.0.0.1 (the `hub` fixture): no internet."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nightlab.harness.cache import DataError
from nightlab.harness.download import download, download_all, hub_url

DATA = os.urandom(300_000)


def test_hub_url_from_env(hub):
    assert hub_url() == hub.url


def test_download_is_atomic_and_counts_bytes(hub, tmp_path: Path):
    hub.add("a.bin", DATA)
    seen = []
    dest = download(f"{hub.url}/a.bin", tmp_path / "out" / "a.bin", on_bytes=seen.append)
    assert dest.read_bytes() == DATA and sum(seen) == len(DATA)
    assert sorted(p.name for p in dest.parent.iterdir()) == ["a.bin", "a.bin.lock"]


def test_existing_file_is_not_fetched_again(hub, tmp_path: Path):
    hub.add("a.bin", DATA)
    download(f"{hub.url}/a.bin", tmp_path / "a.bin")
    download(f"{hub.url}/a.bin", tmp_path / "a.bin")
    assert hub.count("a.bin") == 1


def test_truncated_transfer_resumes_with_range(hub, tmp_path: Path):
    hub.add("a.bin", DATA)
    hub.faults["a.bin"] = ["truncate"]
    dest = download(f"{hub.url}/a.bin", tmp_path / "a.bin")
    assert dest.read_bytes() == DATA
    assert hub.requests == [("a.bin", None), ("a.bin", f"bytes={len(DATA) // 2}-")]


def test_server_that_ignores_range_restarts(hub, tmp_path: Path):
    hub.add("a.bin", DATA)
    hub.faults["a.bin"] = ["truncate"]
    hub.ignore_range = True
    assert download(f"{hub.url}/a.bin", tmp_path / "a.bin").read_bytes() == DATA


def test_server_error_is_retried(hub, tmp_path: Path):
    hub.add("a.bin", DATA)
    hub.faults["a.bin"] = ["500", "500"]
    assert download(f"{hub.url}/a.bin", tmp_path / "a.bin").read_bytes() == DATA
    assert hub.count("a.bin") == 3


def test_always_truncated_fails_and_leaves_no_complete_file(hub, tmp_path: Path):
    hub.add("a.bin", DATA)
    hub.faults["a.bin"] = ["truncate"] * 10
    with pytest.raises(DataError, match=r"after 3 attempts .*--dataset demo.*local:PATH"):
        download(f"{hub.url}/a.bin", tmp_path / "a.bin")
    assert not (tmp_path / "a.bin").exists()


def test_missing_file_fails_at_once(hub, tmp_path: Path):
    with pytest.raises(DataError, match="HTTP 404"):
        download(f"{hub.url}/nope.bin", tmp_path / "nope.bin")
    assert hub.count("nope.bin") == 1


def test_content_check_failure_refetches_then_fails(hub, tmp_path: Path):
    hub.add("a.bin", DATA)
    hub.faults["a.bin"] = ["garbage"]
    calls = []

    def check(path: Path) -> None:
        calls.append(path.read_bytes() == DATA)
        if path.read_bytes() != DATA:
            raise DataError("bad content")

    assert download(f"{hub.url}/a.bin", tmp_path / "a.bin", check=check).read_bytes() == DATA
    assert calls == [False, True]
    hub.faults["b.bin"] = ["garbage"] * 10
    hub.add("b.bin", DATA)
    with pytest.raises(DataError, match="bad content"):
        download(f"{hub.url}/b.bin", tmp_path / "b.bin", check=check)
    assert not (tmp_path / "b.bin").exists()


def test_offline_names_the_offline_datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DataError, match=r"--dataset demo.*--dataset local:PATH"):
        download(f"http://127.0.0.1:{port}/x.bin", tmp_path / "x.bin", retries=1, backoff=0.001)


def test_download_all_in_parallel(hub, tmp_path: Path):
    jobs = []
    for i in range(6):
        hub.add(f"f{i}.bin", DATA[i * 1000 :])
        jobs.append((f"{hub.url}/f{i}.bin", tmp_path / f"f{i}.bin"))
    done = []
    paths = download_all(jobs, workers=3, on_file=done.append)
    assert paths == [dest for _, dest in jobs] and sorted(done) == sorted(paths)
    assert all(p.read_bytes() == DATA[i * 1000 :] for i, p in enumerate(paths))


def test_unknown_host_fails_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import socket

    def no_dns(*args, **kwargs):  # what an offline machine answers, without asking any DNS server
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    with pytest.raises(DataError, match=r"cannot resolve the host .*--dataset demo"):
        download("http://nightlab-test.invalid/x.bin", tmp_path / "x.bin", retries=5, backoff=10)
