"""The summary parser and the run classifier on arbitrary log tails (property-based).

Whatever a target prints (binary junk, `\\r` storms, ANSI codes, huge lines, duplicated
keys, nan / inf / negative / 1e309 values, a summary inside a traceback, several blocks),
`parse_summary` and `classify` never raise, and never yield a metric that is not in the
last well-formed block (a `---` line followed by at least one `key: value` line).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nightlab.fleet.runner import classify, clean_lines, parse_summary, read_tail

KEYS = st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_.\-]{0,12}\Z")
NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["nan", "inf", "-inf", "1e309", "-1e309", "-0.0", "NaN", "Infinity", "0.997900"]),
    st.integers(-(10**30), 10**30).map(str),
)
VALUES = st.one_of(NUMBERS, st.text(alphabet=st.characters(blacklist_characters="\n\r\x1b"), max_size=20))
ANSI = st.sampled_from(["\x1b[32m", "\x1b[0m", "\x1b[2K", "\x1b]0;title\x07", "\x1b[?25l", "\x1b[1;31m"])
JUNK_LINE = st.one_of(
    st.text(max_size=80),
    st.binary(max_size=80).map(lambda b: b.decode("utf-8", errors="replace")),
    st.builds(
        lambda c, n: c * n, st.sampled_from(["x", " ", "\r", "-", ":", "\x00", "é"]), st.integers(0, 20_000)
    ),
    st.builds(lambda a, t: a + t, ANSI, st.text(max_size=20)),
    st.sampled_from(
        [
            "Traceback (most recent call last):",
            '  File "train.py", line 3, in <module>',
            "ValueError: boom",
            "step 12 loss 3.2\rstep 13 loss 3.1\r",
            "FAIL: loss is nan",
            "CUDA out of memory",
            "----",
            "--- ",
        ]
    ),
)


@st.composite
def blocks(draw) -> tuple[list[str], dict[str, str]]:
    """A well-formed summary block as printed lines, and the key -> value text it means."""
    pairs = draw(st.lists(st.tuples(KEYS, NUMBERS | VALUES), min_size=1, max_size=8))
    if draw(st.booleans()):
        pairs.append(("val_bpb", draw(NUMBERS)))
    if draw(st.booleans()) and pairs:  # a duplicated key: the later line wins
        pairs.append((pairs[0][0], draw(NUMBERS)))
    pad = draw(st.sampled_from(["", " ", "   ", "\t"]))
    lines = ["---"] + [f"{k}:{pad}{v}" for k, v in pairs]
    meaning: dict[str, str] = {}
    for k, v in pairs:
        meaning[k] = v.strip()
    return lines, meaning


def _expected(text: str) -> object:
    try:
        return float(text)
    except ValueError:
        return text


def _same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(st.text(max_size=2000), st.binary(max_size=2000).map(lambda b: b.decode("utf-8", "replace"))),
    st.one_of(st.none(), st.integers(-70, 300)),
    st.booleans(),
    st.booleans(),
)
def test_arbitrary_text_never_raises(text, exit_code, timed_out, lost):
    summary = parse_summary(text)
    outcome = classify(exit_code, text, metric="val_bpb", timed_out=timed_out, lost=lost)
    assert outcome.outcome in {
        "ok",
        "crash:syntax",
        "crash:exception",
        "crash:oom",
        "crash:nan",
        "crash:no-summary",
        "timeout",
        "infra",
        "invalid",
    }
    if outcome.outcome == "ok":
        value = outcome.metrics["val_bpb"]
        assert isinstance(value, float) and math.isfinite(value)
        assert summary is not None and _same(summary["val_bpb"], value)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(
    st.lists(JUNK_LINE, max_size=8),
    st.lists(blocks(), min_size=1, max_size=3),
    st.lists(JUNK_LINE.filter(lambda s: all(x.strip() != "---" for x in clean_lines(s))), max_size=6),
    st.sampled_from(["\n", "\r\n"]),
    st.sampled_from([0, 1, 137, None]),
)
def test_the_last_well_formed_block_wins(prefix, several, suffix, newline, exit_code):
    body: list[str] = list(prefix)
    for lines, _ in several:
        body += lines
    last = several[-1][1]
    # the block ends at the first line that is not `key: value`: here a traceback starts
    body.append("Traceback (most recent call last):")
    body += suffix
    text = newline.join(body) + newline
    summary = parse_summary(text)
    assert summary is not None
    assert set(summary) == set(last)
    for key, value in last.items():
        assert _same(summary[key], _expected(value)), (key, summary[key], value)
    outcome = classify(exit_code, text, metric="val_bpb")
    for key, value in outcome.metrics.items():
        assert key in last and _same(value, _expected(last[key]))
    if outcome.outcome == "ok":
        assert exit_code == 0 and math.isfinite(outcome.metrics["val_bpb"])


@pytest.mark.timeout(60)  # a hang guard, not a timing: the quadratic parser took minutes on these
def test_pathological_tails_never_hang(tmp_path):
    """Found by this suite: every `---` line copied the rest of the list (O(n^2)); 100k of
    them took 55 s. Each of these now takes well under a second (bench/reliability.py)."""
    for text in (
        "---\n" * 400_000,
        "---\nval_bpb: " + " " * 200_000 + "x\n",
        "\r" * 262_144,
        "\x1b[" * 80_000,
    ):
        assert parse_summary(text) is None or isinstance(parse_summary(text), dict)
        log = tmp_path / "log.txt"
        log.write_text(text)
        classify(0, read_tail(log), metric="val_bpb")
