"""Summary parsing and failure classification (nightlab.fleet.runner), on literal logs."""

from __future__ import annotations

import pytest

from nightlab.fleet.runner import classify, parse_summary, read_tail, trim_log
from nightlab.outcome import Outcome

SUMMARY = "---\nval_bpb:          0.997900\ntraining_seconds: 300.1\ndevice: cuda\n"


def test_last_summary_wins_and_values_are_typed():
    text = "---\nval_bpb: 2.0\n" + "noise\n" + SUMMARY
    assert parse_summary(text) == {"val_bpb": 0.9979, "training_seconds": 300.1, "device": "cuda"}


def test_carriage_returns_and_ansi_codes_are_tolerated():
    text = "step 1\rstep 2\r\x1b[1m---\x1b[0m\n\x1b[32mval_bpb:\x1b[0m 1.5\r\n"
    assert parse_summary(text) == {"val_bpb": 1.5}


def test_no_summary():
    assert parse_summary("hello\nworld\n") is None
    assert parse_summary("---\n\n") is None


@pytest.mark.parametrize(
    ("code", "log", "expected"),
    [
        (0, SUMMARY, "ok"),
        (0, "---\nval_bpb: nan\n", "crash:nan"),
        (1, "step 3\nFAIL: loss is nan at step 3\n", "crash:nan"),
        (1, '  File "train.py", line 3\n    x = (\n        ^\nSyntaxError: invalid syntax\n', "crash:syntax"),
        (1, 'Traceback (most recent call last):\n  File "x", line 1\nValueError: boom\n', "crash:exception"),
        (
            1,
            'Traceback (most recent call last):\n  File "x"\ntorch.OutOfMemoryError: CUDA out of memory.\n',
            "crash:oom",
        ),
        (1, 'Traceback (most recent call last):\n  File "x"\nMemoryError\n', "crash:oom"),
        (0, "all good\n", "crash:no-summary"),
        (0, "---\ntraining_seconds: 3\n", "crash:no-summary"),
        (137, "step 1\n", "infra"),
        (143, "step 1\n", "infra"),
        (139, "step 1\n", "crash:exception"),
        (3, "step 1\n", "crash:exception"),
        (1, "loading\nDataNotPreparedError: run `nightlab prepare`\n", "crash:exception"),
        (0, "---\nval_bpb: 1.0\ninvalid_reason: model is not causal\n", "invalid"),
    ],
)
def test_classify(code, log, expected):
    assert classify(code, log, metric="val_bpb").outcome == expected


def test_classify_keeps_the_exception_line():
    out = classify(1, "Traceback (most recent call last):\n  File \"x\"\nKeyError: 'lr'\n", metric="val_bpb")
    assert out.detail == "KeyError: 'lr'"
    chained = (
        "Traceback (most recent call last):\nValueError: a\n\nDuring handling of the above exception, another "
        'exception occurred:\n\nTraceback (most recent call last):\n  File "y"\nRuntimeError: b\n'
    )
    assert classify(1, chained, metric="val_bpb").detail == "RuntimeError: b"


def test_timeout_and_lost_and_fingerprint():
    assert classify(None, "", metric="val_bpb", timed_out=True).outcome == "timeout"
    lost = classify(None, "step 1\n", metric="val_bpb", lost=True)
    assert lost.outcome is Outcome.INFRA  # an enum member, not a string that a typo could miss
    text = "---\nval_bpb: 1.0\ndata_fingerprint: abc\n"
    assert classify(0, text, metric="val_bpb", expected_fingerprint="abc").outcome == "ok"
    bad = classify(0, text, metric="val_bpb", expected_fingerprint="def")
    assert bad.outcome == "invalid" and "nightlab prepare" in bad.detail


def test_invalid_reason_wins_even_without_the_metric_and_overlong_training_is_invalid():
    assert (
        classify(0, "---\nstatus: invalid\ninvalid_reason: bad shape\n", metric="val_bpb").outcome
        == "invalid"
    )
    text = "---\nval_bpb: 1.0\ntraining_seconds: 45.0\n"
    assert classify(0, text, metric="val_bpb", max_training_seconds=33.0).outcome == "invalid"
    assert classify(0, text, metric="val_bpb", max_training_seconds=50.0).outcome == "ok"


def test_tail_and_trim_of_a_huge_log(tmp_path):
    log = tmp_path / "log.txt"
    with open(log, "w") as f:
        for i in range(200_000):
            f.write(f"line {i} " + "x" * 90 + "\n")
        f.write(SUMMARY)
    tail = read_tail(log, limit=4096)
    assert len(tail) <= 4096 and parse_summary(tail)["val_bpb"] == 0.9979
    trim_log(log, keep=100_000)
    assert log.stat().st_size < 101_000
    assert log.read_text().startswith("[nightlab: ")
    assert parse_summary(read_tail(log))["val_bpb"] == 0.9979
