"""How figures read (nightlab.display): integers as integers, sensible digits, no Python reprs.

Run: .venv/bin/python -m pytest -q tests/core/test_display.py
"""

from __future__ import annotations

import time

import pytest

from nightlab.display import exact, fact, metric_note, number


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (273.0, "273"),  # num_steps, stored as a REAL by the ledger
        (2.0, "2"),
        (18445.0, "18445"),
        (45060.23, "45060.2"),
        (300.14, "300.1"),
        (39.8, "39.8"),
        (0.04, "0.04"),
        (0.123456, "0.1235"),
        (-1e-3, "-0.001"),
        (0, "0"),
        (None, "-"),
        ("n/a", "n/a"),
        ("cpu (2 threads)", "cpu (2 threads)"),
        (True, "True"),
        (float("nan"), "nan"),
    ],
)
def test_number(value, text) -> None:
    assert number(value) == text


def test_the_metric_keeps_six_decimals() -> None:
    assert number(0.9979, metric=True) == "0.997900"
    assert number(1.0, metric=True) == "1.000000"  # a metric that happens to be integral


def test_exact_keeps_every_digit_but_prints_integers_as_integers() -> None:
    assert exact(273.0) == "273" and exact(0.123456789) == "0.123456789" and exact(None) == ""
    assert exact("sdpa") == "sdpa"


def test_peak_vram_on_cpu_says_what_it_is() -> None:
    assert metric_note("peak_vram_mb", {"device": "cpu (2 threads)"}) == "peak RSS on CPU"
    assert metric_note("peak_vram_mb", {"device": "NVIDIA H100 80GB HBM3"}) is None
    assert metric_note("num_steps", {"device": "cpu"}) is None


def test_fact_reads_without_python_reprs_or_epoch_times() -> None:
    assert fact("promoted", {"e0013": ["e0014", "e0015"]}) == 'e0013=["e0014","e0015"]'
    assert fact("limits", {"max_hours": None, "max_experiments": 20.0}) == "max_experiments=20"
    assert fact("limits", {"max_hours": None}) == "-"
    assert fact("spaces", ["LR=0.01,0.02", "DEPTH=2,4"]) == "LR=0.01,0.02, DEPTH=2,4"
    ts = time.mktime((2026, 12, 1, 9, 30, 0, 0, 0, -1))
    assert fact("updated_at", ts) == "2026-12-01 09:30:00"
    assert fact("design", None) == "-" and fact("top_k", 2.0) == "2"
    assert "{" not in fact("search", {"key": {"strategy": "greedy"}, "index": 0}).split("=", 1)[0]
