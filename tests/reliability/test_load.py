"""50 concurrent CLI clients (submit, status, results, show, wait) against one lab while a
wave runs: zero "database is locked", zero lost submissions. The p95 latency of each
command is printed here and recorded by `bench/reliability.py` (never asserted: the dev
box is 2 shared cores).
"""

from __future__ import annotations

from nightlab.testing.reliability import load_wave


def test_fifty_concurrent_clients_while_a_wave_runs(tmp_path):
    r = load_wave(tmp_path, clients=50, rounds=1, experiments=24, slots=4)
    assert r["locked"] == 0, r["errors"]
    assert r["errors"] == []
    assert r["submits_ok"] == r["submits_expected"] == 10
    assert r["submits_lost"] == []
    assert r["lost"] == [] and r["duplicated"] == [] and r["open_attempts"] == 0
    assert r["outcomes"] == {"ok": 34}
    print({k: round(v, 2) for k, v in r["p95"].items()})
