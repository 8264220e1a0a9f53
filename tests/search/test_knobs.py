"""Tests for nightlab.search.knobs: listing UPPERCASE constants and rewriting them byte-for-byte.

Run: .venv/bin/python -m pytest -q tests/search/test_knobs.py
"""

from __future__ import annotations

import pytest

from nightlab.errors import UsageError
from nightlab.search.knobs import Knob, list_knobs, parse_value, set_knobs

SCRIPT = """\
\"\"\"A training script.\"\"\"
import math

DEPTH = 8  # number of layers
TOTAL_BATCH_SIZE = 2**19   # tokens per step
MATRIX_LR: float = 0.04
WINDOW_PATTERN = 'SSSL'
BETAS = (0.8,
         0.95)  # Adam betas
USE_FLAG = True
NOTHING = None
WARMUP = -1e-3
SCHEDULE = [1, 2, 3]
lowercase = 5
Mixed_Case = 6
DERIVED = DEPTH * 64
HEAD = math.sqrt(2)

def f():
    INNER = 3
    return INNER
"""


def by_name(source: str) -> dict[str, Knob]:
    return {k.name: k for k in list_knobs(source)}


# --- list_knobs ---------------------------------------------------------------------------


def test_list_knobs_values_types_lines_and_sources() -> None:
    knobs = by_name(SCRIPT)
    assert list(knobs) == [
        "DEPTH",
        "TOTAL_BATCH_SIZE",
        "MATRIX_LR",
        "WINDOW_PATTERN",
        "BETAS",
        "USE_FLAG",
        "NOTHING",
        "WARMUP",
        "SCHEDULE",
    ]
    assert knobs["DEPTH"] == Knob("DEPTH", "8", 8, "int", 4)
    assert knobs["TOTAL_BATCH_SIZE"] == Knob("TOTAL_BATCH_SIZE", "2**19", 2**19, "int", 5)
    assert knobs["MATRIX_LR"] == Knob("MATRIX_LR", "0.04", 0.04, "float", 6)
    assert knobs["WINDOW_PATTERN"] == Knob("WINDOW_PATTERN", "'SSSL'", "SSSL", "str", 7)
    assert knobs["BETAS"] == Knob("BETAS", "(0.8,\n         0.95)", (0.8, 0.95), "tuple", 8)
    assert knobs["USE_FLAG"].type == "bool" and knobs["USE_FLAG"].value is True
    assert knobs["NOTHING"].type == "none" and knobs["NOTHING"].value is None
    assert knobs["WARMUP"].value == -1e-3 and knobs["WARMUP"].type == "float"
    assert knobs["SCHEDULE"].type == "list"


def test_constant_arithmetic() -> None:
    knobs = by_name("A = 3*1024\nB = 1/3\nC = 2**-1\nD = 7 // 2 % 3\nE = {'a': 1}\nF = 1j\n")
    assert knobs["A"].value == 3072 and knobs["A"].type == "int"
    assert knobs["B"].value == pytest.approx(1 / 3) and knobs["B"].type == "float"
    assert knobs["C"].value == 0.5
    assert knobs["D"].value == 0
    assert knobs["E"].type == "expr" and knobs["F"].type == "expr"


def test_non_constants_and_hostile_values_are_skipped() -> None:
    source = "A = 1/0\nB = 10**10**9\nC = 'a' * 3\nD = True + 1\nE = ...\nF = [x for x in (1,)]\nH = {[1]: 2}\nG = 2\n"
    assert list(by_name(source)) == ["G"]


def test_last_definition_wins_and_later_rebinding_disqualifies() -> None:
    source = "LR = 0.1\nLR = 0.2\nWD = 0.1\nWD *= 2\nBS = 4\nif True:\n    BS = 8\nN = 1\nN: int\n"
    knobs = by_name(source)
    assert knobs["LR"] == Knob("LR", "0.2", 0.2, "float", 2)
    assert "WD" not in knobs and "BS" not in knobs
    assert knobs["N"].value == 1  # a bare annotation binds nothing
    assert set_knobs(source, {"LR": "0.3"}) == source.replace("LR = 0.2", "LR = 0.3")


def test_syntax_error_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="line 1"):
        list_knobs("X = (1,\n")


# --- set_knobs ----------------------------------------------------------------------------


def test_set_knobs_rewrites_only_the_value() -> None:
    new = set_knobs(SCRIPT, {"DEPTH": "12", "TOTAL_BATCH_SIZE": "2**17", "WINDOW_PATTERN": "'L'"})
    expected = (
        SCRIPT.replace("DEPTH = 8  #", "DEPTH = 12  #")
        .replace("= 2**19   #", "= 2**17   #")
        .replace("'SSSL'", "'L'")
    )
    assert new == expected
    knobs = by_name(new)
    assert knobs["DEPTH"].value == 12 and knobs["TOTAL_BATCH_SIZE"].value == 2**17
    assert knobs["WINDOW_PATTERN"].value == "L"


def test_type_annotated_knob() -> None:
    new = set_knobs(SCRIPT, {"MATRIX_LR": "0.02"})
    assert "MATRIX_LR: float = 0.02\n" in new
    assert new.replace("0.02", "0.04", 1) == SCRIPT


def test_multiline_value_replaced_whole() -> None:
    new = set_knobs(SCRIPT, {"BETAS": "(0.9, 0.99)"})
    assert "BETAS = (0.9, 0.99)  # Adam betas\nUSE_FLAG" in new
    assert by_name(new)["BETAS"].value == (0.9, 0.99)
    assert new.count("\n") == SCRIPT.count("\n") - 1


def test_crlf_and_cr_line_endings_preserved() -> None:
    crlf = "A = 1  # one\r\nB = (1,\r\n  2)\r\nC = 'x'\r\n"
    new = set_knobs(crlf, {"B": "(3, 4)", "C": "'y'"})
    assert new == "A = 1  # one\r\nB = (3, 4)\r\nC = 'y'\r\n"
    cr = "A = 1\rB = 2\r"
    assert set_knobs(cr, {"B": "5"}) == "A = 1\rB = 5\r"


def test_non_ascii_before_the_value() -> None:
    source = "NOTE = 'é—ü'; RATE = 0.5  # ratio ∈ (0, 1)\nX = 1\n"
    assert by_name(source)["RATE"].source == "0.5"
    new = set_knobs(source, {"RATE": "0.25", "NOTE": "'ß'"})
    assert new == "NOTE = 'ß'; RATE = 0.25  # ratio ∈ (0, 1)\nX = 1\n"


def test_byte_order_mark_kept() -> None:
    source = "\ufeffA = 1  # first\nB = 'é'\n"
    assert [k.source for k in list_knobs(source)] == ["1", "'é'"]
    assert set_knobs(source, {"A": "2", "B": "'x'"}) == "\ufeffA = 2  # first\nB = 'x'\n"


def test_no_values_is_identity() -> None:
    assert set_knobs(SCRIPT, {}) == SCRIPT


def test_unknown_knob_lists_known_closest_first() -> None:
    with pytest.raises(UsageError) as info:
        set_knobs(SCRIPT, {"MATRIX_RL": "0.1"})
    message = str(info.value)
    assert "`MATRIX_RL`" in message
    assert message.split("known knobs: ")[1].startswith("MATRIX_LR, ")
    assert "lowercase" not in message and "INNER" not in message


def test_a_script_without_knobs_says_so_in_one_line() -> None:
    # difflib refused to list the close matches of an empty list (n=0): a traceback, not this line
    with pytest.raises(UsageError, match=r"unknown knob `LR`; known knobs: none \(no UPPERCASE"):
        set_knobs("import time\ntime.sleep(0.1)\n", {"LR": "0.1"})


def test_non_uppercase_names_are_not_knobs() -> None:
    for name in ("lowercase", "Mixed_Case", "INNER", "DERIVED"):
        with pytest.raises(UsageError, match="unknown knob"):
            set_knobs(SCRIPT, {name: "1"})


def test_non_literal_value_refused_and_source_untouched() -> None:
    for bad in ("math.sqrt(2)", "DEPTH * 2", "0.1 +", "import os", "(1,\n2)"):
        with pytest.raises(UsageError) as info:
            set_knobs(SCRIPT, {"DEPTH": bad})
        assert "not a Python literal" in str(info.value) or "one line" in str(info.value)


# --- parse_value --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [("0.02", 0.02), ("2**16", 65536), ("'L'", "L"), ("True", True), (" (1, 2) ", (1, 2)), ("None", None)],
)
def test_parse_value(text: str, value: object) -> None:
    assert parse_value(text) == value


def test_parse_value_names_the_bad_value() -> None:
    with pytest.raises(UsageError, match="`SSSL`"):
        parse_value("SSSL")


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("DEPTH", "2.5", "knob `DEPTH` is int `8`, not float; give an int"),
        ("DEPTH", "True", "knob `DEPTH` is int `8`, not bool; give an int"),
        ("BETAS", "0.9", "not float; give a tuple of 2 (float, float)"),
        ("BETAS", "(0.9, 0.99, 0.999)", "not a tuple of 3; give a tuple of 2 (float, float)"),
        ("BETAS", "('a', 0.99)", "give a tuple of 2 (float, float)"),
        ("WINDOW_PATTERN", "1", "knob `WINDOW_PATTERN` is str `'SSSL'`, not int; give a quoted string"),
        ("USE_FLAG", "1", "knob `USE_FLAG` is bool `True`, not int; give True or False"),
        ("MATRIX_LR", "'fast'", "knob `MATRIX_LR` is float `0.04`, not str; give a number"),
    ],
)
def test_set_refuses_a_value_of_another_type(name: str, value: str, why: str) -> None:
    with pytest.raises(UsageError) as info:
        set_knobs(SCRIPT, {name: value})
    assert str(info.value).startswith(f"`{name}={value}`: ") and why in str(info.value)


def test_set_accepts_values_that_fit_the_knob() -> None:
    fits = {
        "DEPTH": "2**3",
        "MATRIX_LR": "1",  # an int where a float is: a number all the same
        "BETAS": "[0.9, 1]",
        "USE_FLAG": "False",
        "NOTHING": "'anything'",  # a None knob says nothing of its type
        "SCHEDULE": "[1, 2, 3, 4]",  # a list's length is free, a tuple's is not
        "WARMUP": "None",  # None switches a feature off, as in a sweep's list
    }
    knobs = by_name(set_knobs(SCRIPT, fits))
    assert knobs["DEPTH"].value == 8 and knobs["BETAS"].value == [0.9, 1] and knobs["WARMUP"].value is None


def test_unknown_knob_says_did_you_mean_the_closest() -> None:
    with pytest.raises(
        UsageError, match=r"unknown knob `matrix_lr`; did you mean `MATRIX_LR`\? known knobs: MATRIX_LR, "
    ):
        set_knobs(SCRIPT, {"matrix_lr": "0.1"})
    with pytest.raises(UsageError) as info:
        set_knobs(SCRIPT, {"QQQQ": "0.1"})
    assert "did you mean" not in str(info.value)  # nothing is close: no guess
