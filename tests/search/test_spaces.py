"""Tests for nightlab.search.spaces: the NAME=... grammar, coding, source text and knob checks.

Run: .venv/bin/python -m pytest -q tests/search/test_spaces.py
"""

from __future__ import annotations

import random

import pytest

from nightlab.errors import UsageError
from nightlab.search.knobs import list_knobs
from nightlab.search.spaces import (
    SPACE_FORMS,
    Choice,
    IntRange,
    LogUniform,
    Pow2,
    Uniform,
    check_knobs,
    coded_levels,
    parse_space,
)

SCRIPT = (
    "DEPTH = 8\nMATRIX_LR = 0.04\nTOTAL_BATCH_SIZE = 2**19\nWINDOW_PATTERN = 'SSSL'\nBETAS = (0.8, 0.95)\n"
)


def test_parse_each_form() -> None:
    assert parse_space("DEPTH=4,8,12") == Choice("DEPTH", ("4", "8", "12"))
    assert parse_space("DEPTH=int(4,12)") == IntRange("DEPTH", 4, 12)
    assert parse_space("WD=uniform(0, 0.2)") == Uniform("WD", 0, 0.2)
    assert parse_space("MATRIX_LR=log(0.01,0.08)") == LogUniform("MATRIX_LR", 0.01, 0.08)
    assert parse_space("TOTAL_BATCH_SIZE=pow2(2**16,2**19)") == Pow2("TOTAL_BATCH_SIZE", 2**16, 2**19)


def test_list_values_keep_their_source_and_allow_tuples_and_bare_words() -> None:
    assert parse_space("BETAS=(0.8, 0.95),(0.9,0.99)").sources == ("(0.8, 0.95)", "(0.9,0.99)")
    dim = parse_space("WINDOW_PATTERN=SSSL,'L'")
    assert dim.sources == ("'SSSL'", "'L'")
    assert dim.values == ("SSSL", "L")
    assert parse_space("X=-1,2**3").values == (-1, 8)


@pytest.mark.parametrize(
    "spec",
    [
        "DEPTH",
        "DEPTH=",
        "=1,2",
        "DEPTH=8",
        "DEPTH=1,1",
        "DEPTH=int(4)",
        "DEPTH=int(12,4)",
        "DEPTH=int(4,4)",
        "DEPTH=int(1.5,4)",
        "LR=log(0,1)",
        "LR=normal(0,1)",
        "BS=pow2(16,100)",
        "BS=pow2(16,19.5)",
        "X=a b",
        "X=uniform('a',1)",
    ],
)
def test_malformed_specs_show_the_accepted_forms(spec: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_space(spec)
    assert SPACE_FORMS in str(info.value)
    assert f"`{spec}`" in str(info.value)


def test_levels_and_coding_round_trip() -> None:
    lr = parse_space("LR=log(0.01,0.16)")
    assert lr.levels(3) == [0.01, 0.04, 0.16]
    assert lr.two_levels() == (0.01, 0.16)
    assert lr.coded(0.04) == pytest.approx(0.0)
    assert lr.coded(1.0) == 1.0  # clipped
    depth = parse_space("DEPTH=int(4,12)")
    assert depth.levels(5) == [4, 6, 8, 10, 12]
    assert depth.levels(20) == list(range(4, 13))  # no duplicate levels
    bs = parse_space("BS=pow2(16,128)")
    assert bs.levels(4) == [16, 32, 64, 128]
    assert bs.coded(32) == pytest.approx(-1 / 3)
    assert [bs.to_source(v) for v in bs.two_levels()] == ["2**4", "2**7"]
    for dim in (lr, depth, bs, parse_space("WD=uniform(0,0.2)"), parse_space("P=SSSL,L,M")):
        for value in dim.levels(4):
            assert dim.from_coded(dim.coded(value)) == value


def test_choice_coding_and_two_levels() -> None:
    dim = parse_space("P=SSSL,L,M")
    assert [dim.coded(v) for v in dim.values] == [-1.0, 0.0, 1.0]
    assert dim.to_source("L") == "'L'"
    with pytest.raises(UsageError, match="exactly 2"):
        dim.two_levels()
    with pytest.raises(UsageError, match="not in the list"):
        dim.coded("X")


def test_samples_stay_in_range_and_read_back_exactly() -> None:
    rng = random.Random(1)
    for spec in ("LR=log(0.001,0.1)", "WD=uniform(0,0.3)", "D=int(2,5)", "BS=pow2(8,64)", "P=a,b"):
        dim = parse_space(spec)
        for _ in range(50):
            value = dim.sample(rng)
            assert dim.coded(value) == pytest.approx(max(-1.0, min(1.0, dim.coded(value))))
            assert eval(dim.to_source(value)) == value  # noqa: S307 - literal text from the dimension
    assert {parse_space("BS=pow2(8,64)").sample(rng) for _ in range(200)} == {8, 16, 32, 64}


def test_check_knobs_accepts_a_fitting_space() -> None:
    dims = [
        parse_space(s)
        for s in (
            "DEPTH=int(4,12)",
            "MATRIX_LR=log(0.01,0.08)",
            "TOTAL_BATCH_SIZE=pow2(2**16,2**19)",
            "WINDOW_PATTERN=SSSL,L",
            "BETAS=(0.8,0.95),(0.9,0.99)",
        )
    ]
    check_knobs(dims, list_knobs(SCRIPT))


def test_check_knobs_unknown_knob_suggests_the_closest() -> None:
    with pytest.raises(UsageError) as info:
        check_knobs([parse_space("MATRIX_L=log(0.01,0.08)")], list_knobs(SCRIPT))
    assert "unknown knob `MATRIX_L`" in str(info.value)
    assert "known knobs: MATRIX_LR" in str(info.value)


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("DEPTH=uniform(4,12)", "is int"),
        ("WINDOW_PATTERN=int(1,3)", "is str"),
        ("WINDOW_PATTERN=1,2", "the list has int"),
        ("DEPTH=0.5,1.5", "the list has float"),
    ],
)
def test_check_knobs_type_mismatch(spec: str, why: str) -> None:
    with pytest.raises(UsageError, match=why):
        check_knobs([parse_space(spec)], list_knobs(SCRIPT))


def test_check_knobs_duplicate_space() -> None:
    with pytest.raises(UsageError, match="two search spaces"):
        check_knobs([parse_space("DEPTH=4,8"), parse_space("DEPTH=int(2,4)")], list_knobs(SCRIPT))


@pytest.mark.parametrize(
    "spec",
    [
        "D=4,8,12",
        "P=SSSL,'L'",
        "B=(0.8, 0.95),(0.9,0.99)",
        "D=int(4,12)",
        "W=uniform(0,0.2)",
        "LR=log(0.001,0.1)",
        "BS=pow2(16,2**19)",
    ],
)
def test_spec_round_trips(spec: str) -> None:
    dim = parse_space(spec)
    assert parse_space(dim.spec()) == dim


def test_coded_levels_of_a_run() -> None:
    dims = [parse_space("LR=log(0.01,0.16)"), parse_space("P=a,b")]
    assert coded_levels(dims, {"LR": "0.04", "P": "'b'", "OTHER": "1"}) == {
        "LR": pytest.approx(0.0),
        "P": 1.0,
    }
    with pytest.raises(UsageError, match="no value for knob `P`"):
        coded_levels(dims, {"LR": "0.04"})


def test_a_missing_bracket_is_named_not_taken_for_an_unknown_range() -> None:
    with pytest.raises(UsageError) as info:
        parse_space("MATRIX_LR=log(0.01,0.08")
    assert "`log(` has no closing `)`" in str(info.value) and "unknown range" not in str(info.value)
    with pytest.raises(UsageError, match="unknown range `normal`"):
        parse_space("LR=normal(0,1)")


def test_a_list_follows_the_set_type_rule() -> None:
    # a bool is not an int, a tuple keeps its length: the rule `submit --set` follows (knobs.mismatch)
    with pytest.raises(UsageError, match="the list has bool"):
        check_knobs([parse_space("DEPTH=True,4")], list_knobs(SCRIPT))
    with pytest.raises(UsageError, match="the list has tuple"):
        check_knobs([parse_space("BETAS=(0.8,0.95),(0.9,0.99,0.999)")], list_knobs(SCRIPT))
