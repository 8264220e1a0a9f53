"""Small pure pieces of `nightlab.web._views`.

Run: .venv/bin/python -m pytest -q tests/web/test_views.py
"""

from __future__ import annotations

import math

from nightlab.web._views import _gpu, counts, finite


def test_gpu_column():
    assert _gpu({"gpu": 1}, None) == "cuda:1"
    assert _gpu({"accelerators": "H100:1", "infra": "k8s"}, None) == "H100:1"
    assert _gpu({"accelerators": "H100:1"}, {"gpu_name": "NVIDIA H100 80GB HBM3"}) == "NVIDIA H100 80GB HBM3"
    assert _gpu({"threads": 1}, None) is None
    # one GPU of a multi-GPU SkyPilot node (issue 36): the node's GPU name and the slot's index
    lane = {"accelerators": "H100:8", "cluster": "h100-aws-0", "gpu": "3", "slots": 8}
    assert _gpu(lane, {"gpu_name": "NVIDIA H100 80GB HBM3"}) == "NVIDIA H100 80GB HBM3 (GPU 3)"


def test_counts():
    rows = [
        {"status": "finished", "outcome": "ok"},
        {"status": "finished", "outcome": "crash:oom"},
        {"status": "finished", "outcome": "timeout"},
        {"status": "finished", "outcome": "invalid"},
        {"status": "running", "outcome": None},
        {"status": "cancelled", "outcome": "cancelled"},
        {"status": "finished", "outcome": "degraded"},  # starved: counted apart, never as a crash
    ]
    assert counts((r["status"], r["outcome"]) for r in rows) == {
        "done": 5, "ok": 1, "crashed": 2, "invalid": 1, "degraded": 1, "running": 1, "queued": 0, "cancelled": 1,
    }  # fmt: skip


def test_finite_replaces_nan_and_inf_for_browsers():
    assert finite({"a": [math.nan, 1.0, {"b": math.inf}], "c": "nan"}) == {
        "a": [None, 1.0, {"b": None}],
        "c": "nan",
    }


def test_host_name():
    from nightlab.web.app import host_name

    assert host_name("127.0.0.1:8350") == "127.0.0.1"
    assert host_name("localhost") == "localhost"
    assert host_name("[::1]:8350") == "::1"
    assert host_name("[::1]") == "::1"
    assert host_name("evil.example:80") == "evil.example"


def test_version_cache_computes_once_per_version_even_when_asked_at_once():
    import threading
    import time

    from nightlab.web._views import VersionCache

    class Lab:
        def __init__(self, version: str) -> None:
            self._version = version

        def version(self) -> str:
            return self._version

    calls: list[str] = []

    def slow(lab: Lab) -> str:
        calls.append(lab.version())
        time.sleep(0.05)
        return f"data@{lab.version()}"

    cache = VersionCache()
    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(cache.get(Lab("v1"), "x", slow))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == ["data@v1"] * 4 and calls == ["v1"]
    assert cache.get(Lab("v2"), "x", slow) == "data@v2" and calls == ["v1", "v2"]
    assert cache.get(Lab("v2"), "y", slow) == "data@v2" and len(calls) == 3  # names are separate
