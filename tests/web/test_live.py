"""Parsing the latest training loss and progress from a running log (`nightlab.web._live`).

Run: .venv/bin/python -m pytest -q tests/web/test_live.py
"""

from __future__ import annotations

import math

import pytest

from nightlab.web._live import TAIL_BYTES, log_progress, parse_progress


@pytest.mark.parametrize(
    ("text", "loss", "percent"),
    [
        # autoresearch: progress overwritten in place with \r, no newline until the end
        (
            "step 00001 (0.1%) | loss: 9.012 | dt 310ms\rstep 00042 (12.3%) | loss: 3.123 | dt 300ms\r",
            3.123,
            12.3,
        ),
        # the built-in GPT target: `loss 3.1234`, whole percent
        ("batch: 1024 tokens/step\nstep 00100 (33%) | loss 3.1234 | lr 0.04\n", 3.1234, 33.0),
        ("step 7 train_loss=2.5e-1 val_loss: 9.0\n", 0.25, None),
        ("\x1b[32mstep 3 (50%) | loss: 1.5\x1b[0m\n", 1.5, 50.0),
        ("step 2 | loss: 2.0\nevaluating...\n", 2.0, None),  # the last line with a loss wins
    ],
)
def test_parse_progress(text, loss, percent):
    got = parse_progress(text)
    assert got.loss == pytest.approx(loss) and got.percent == percent


def test_val_loss_alone_is_not_a_training_loss():
    assert parse_progress("val_loss: 3.2\n").loss is None


def test_nan_loss():
    assert math.isnan(parse_progress("step 12 | loss: nan\n").loss)


def test_no_loss_yet():
    got = parse_progress("compiling...\rwarming up\n")
    assert got.loss is None and got.percent is None and got.line is None


def test_log_progress_reads_only_the_tail(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("step 1 | loss: 8.0\n" + "x" * (2 * TAIL_BYTES) + "\nstep 900 (90%) | loss: 2.25\r")
    got = log_progress(log)
    assert got.loss == 2.25 and got.percent == 90.0
    assert log_progress(tmp_path / "missing.txt").loss is None
    assert log_progress(None).loss is None
