"""Tests for nightlab.harness.tune: candidates, measurement parsing, failures, writing the fastest choice.

A synthetic train.py stands in for the GPT template: it prints a summary whose tokens/s depend on
its knobs, fails for some, so the tests run in seconds. test_train.py runs the real template.
Run: .venv/bin/python -m pytest -q tests/harness/test_tune.py
"""

from __future__ import annotations

import pytest

from nightlab.errors import NightlabError, UsageError
from nightlab.harness.tune import tune

NIGHTLAB_TOML = """\
[profile]
name = "test"
dataset = "demo"
vocab_size = 512
seq_len = 16
budget_seconds = 1.0
eval_tokens = 64
"""

FAKE_TRAIN = """\
import os
DEVICE_BATCH_SIZE = 4  # rows
TOTAL_BATCH_SIZE = 2**8
ATTENTION = "auto"
COMPILE = "auto"
assert os.environ["NIGHTLAB_MAX_STEPS"] == "7" and os.environ["NIGHTLAB_SKIP_EVAL"] == "1"
if DEVICE_BATCH_SIZE == 16:
    raise SystemExit("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
if DEVICE_BATCH_SIZE == 1:
    raise SystemExit("RuntimeError: something else broke")
ran_compiled = COMPILE == "on" and DEVICE_BATCH_SIZE != 8  # at 8 the compile "falls back" to eager
print("step 00001 | loss 5.0")
print("---")
speed = ({2: 3000, 8: 4000}.get(DEVICE_BATCH_SIZE, 5000)) + (900 if ran_compiled else 0)
print(f"tok_per_sec:      {speed if COMPILE != 'auto' else 1000}")  # the file's own setting is slow
print(f"peak_vram_mb:     {10.0 * DEVICE_BATCH_SIZE}")
print(f"startup_seconds:  {40.0 if ran_compiled else 2.0}")
print(f"compile:          {'on' if ran_compiled else 'off'}")
print("attention:        sdpa")
"""


@pytest.fixture
def lab(tmp_path):
    (tmp_path / "nightlab.toml").write_text(NIGHTLAB_TOML)
    (tmp_path / "train.py").write_bytes(FAKE_TRAIN.replace("\n", "\r\n").encode())  # CRLF survives
    return tmp_path


def test_fastest_candidate_is_written_into_the_knobs(lab):
    result = tune(lab, steps=7, compiles=["on", "off"], attentions=["sdpa"], progress=False)
    # the current setting first, then the default batch sizes: half, same, double of 4 (all divide 256 / 16)
    assert [(r.candidate.compile, r.candidate.device_batch_size) for r in result.rows] == [
        ("auto", 4), ("on", 2), ("on", 4), ("on", 8), ("off", 2), ("off", 4), ("off", 8),
    ]  # fmt: skip
    assert result.current is result.rows[0] and result.current.tok_per_sec == 1000
    assert all(len(r.runs) == 3 and r.spread == 0.0 for r in result.rows)  # 3 repeats each by default
    assert result.beats_current and "beyond the spread" in result.reason
    assert all(r.status == "ok" for r in result.rows)
    assert result.best.candidate == type(result.best.candidate)("on", "sdpa", 4)
    assert result.best.tok_per_sec == 5900 and result.best.peak_memory_mb == 40.0
    assert result.best.startup_seconds == 40.0  # shown, not weighed: the budget excludes start-up
    assert result.written == {"COMPILE": "'on'", "ATTENTION": "'sdpa'", "DEVICE_BATCH_SIZE": "4"}
    expected = FAKE_TRAIN.replace('COMPILE = "auto"', "COMPILE = 'on'").replace(
        'ATTENTION = "auto"', "ATTENTION = 'sdpa'"
    )
    assert (lab / "train.py").read_bytes() == expected.replace("\n", "\r\n").encode()


def test_oom_and_crash_are_recorded_and_a_fallen_back_compile_is_written_as_off(lab, capsys):
    result = tune(lab, steps=7, batch_sizes=[1, 8, 16], compiles=["on"], attentions=["sdpa"])
    assert [r.status for r in result.rows] == ["ok", "crash", "ok", "oom"]  # the current setting first
    assert "something else broke" in result.rows[1].detail
    assert len(result.rows[1].runs) == 0  # a crash is not repeated
    assert result.best.candidate.device_batch_size == 8 and result.best.compiled is False
    assert result.written["COMPILE"] == "'off'"  # asked for on, ran eager: the measurement is of eager
    table = capsys.readouterr().err
    assert "oom" in table and "fastest" in table


def test_all_candidates_failing_writes_nothing(lab):
    # the current setting is measured too: make it fail like the candidate
    (lab / "train.py").write_text(FAKE_TRAIN.replace("DEVICE_BATCH_SIZE = 4", "DEVICE_BATCH_SIZE = 16"))
    before = (lab / "train.py").read_bytes()
    with pytest.raises(NightlabError, match="every tune candidate failed"):
        tune(lab, steps=7, batch_sizes=[16], compiles=["off"], attentions=["sdpa"], progress=False)
    assert (lab / "train.py").read_bytes() == before


def test_write_false_leaves_train_py_alone(lab):
    before = (lab / "train.py").read_bytes()
    result = tune(
        lab, steps=7, batch_sizes=[2], compiles=["off"], attentions=["sdpa"], write=False, progress=False
    )
    assert result.best.tok_per_sec == 3000 and result.written == {}
    assert (lab / "train.py").read_bytes() == before


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_sizes": [3]}, "batch size `3`"),
        ({"compiles": ["maybe"]}, "compile `maybe`"),
        ({"attentions": ["fa2"]}, "attention `fa2`"),
        ({"steps": 0}, "steps `0`"),
    ],
)
def test_bad_options_are_usage_errors(lab, kwargs, message):
    with pytest.raises(UsageError, match=message):
        tune(lab, **{"steps": 7, "progress": False, **kwargs})


def test_missing_knob_or_train_py(lab, tmp_path):
    (lab / "train.py").write_text(FAKE_TRAIN.replace('COMPILE = "auto"\n', ""))
    with pytest.raises(UsageError, match="no knob `COMPILE`"):
        tune(lab, progress=False)
    with pytest.raises(UsageError, match="no train.py"):
        tune(tmp_path / "nowhere", progress=False)


def test_tune_runs_the_real_template(tmp_path, monkeypatch):
    from importlib import resources

    from nightlab.harness.data import prepare
    from nightlab.harness.profiles import Profile, fingerprint
    from nightlab.search.knobs import list_knobs, set_knobs

    profile = Profile("test", "demo", vocab_size=512, seq_len=64, budget_seconds=1.0, eval_tokens=64)
    prepare(profile, data_dir=tmp_path / "data" / fingerprint(profile), progress=False)
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "nightlab.toml").write_text(NIGHTLAB_TOML.replace("seq_len = 16", "seq_len = 64"))
    source = resources.files("nightlab.targets.gpt").joinpath("train.py").read_text()
    # the current setting is one of the candidates (compile off): no extra, compiling, candidate
    tiny = {
        "DEPTH": "1",
        "HEAD_DIM": "64",
        "DEVICE_BATCH_SIZE": "2",
        "TOTAL_BATCH_SIZE": "256",
        "COMPILE": "'off'",
        "ATTENTION": "'sdpa'",
    }
    (lab / "train.py").write_text(set_knobs(source, tiny))
    monkeypatch.setenv("NIGHTLAB_DATA_DIR", str(tmp_path / "data"))
    result = tune(
        lab, steps=4, batch_sizes=[2, 4], compiles=["off"], attentions=["sdpa"], progress=False, repeats=2
    )
    assert [r.status for r in result.rows] == ["ok", "ok"], [r.detail for r in result.rows]
    assert all(len(r.runs) == 2 and r.spread is not None for r in result.rows)
    assert all(r.tok_per_sec > 0 and r.peak_memory_mb > 0 and r.attention == "sdpa" for r in result.rows)
    knobs = {k.name: k.value for k in list_knobs((lab / "train.py").read_text())}
    assert (knobs["COMPILE"], knobs["ATTENTION"]) == ("off", "sdpa")
    # written only when the winner beat the current setting (batch 2) beyond the spread
    assert knobs["DEVICE_BATCH_SIZE"] == (result.best.candidate.device_batch_size if result.written else 2)


def test_hung_candidate_times_out_and_zero_throughput_is_not_ok(lab):
    source = (lab / "train.py").read_text()
    hang = source.replace(
        "ran_compiled =", "import time\nif DEVICE_BATCH_SIZE == 8: time.sleep(60)\nran_compiled ="
    )
    (lab / "train.py").write_text(hang.replace("({2: 3000", "({2: 0"))
    result = tune(
        lab, steps=7, batch_sizes=[2, 4, 8], compiles=["off"], attentions=["sdpa"], timeout=3, progress=False
    )
    assert [r.status for r in result.rows] == ["ok", "crash", "ok", "timeout"]
    assert "no timed steps" in result.rows[1].detail
    assert result.best.candidate.device_batch_size == 4


def _tune_lab(tmp_path):
    """A lab on the fake trainer with the tune profile committed (what the CLI tests start from)."""
    import subprocess

    from labkit import nightlab

    target = tmp_path / "target"
    target.mkdir()
    (target / "train.py").write_text(FAKE_TRAIN)
    lab = tmp_path / "lab"
    nightlab("init", str(lab), "--target", str(target), "--command", "python train.py", cwd=tmp_path)
    toml = lab / "nightlab.toml"
    toml.write_text(toml.read_text() + "\n" + NIGHTLAB_TOML)
    subprocess.run(["git", "commit", "-qam", "a profile"], cwd=lab, check=True)
    return lab


def test_cli_passes_the_candidates_through(tmp_path):
    """`nightlab tune --compile off --attention sdpa` measures only those (e.g. no 40 s CPU compile)."""
    import json

    from labkit import nightlab

    lab = _tune_lab(tmp_path)
    # --no-measure: no runs of the tuned incumbent are queued, so no controller starts
    args = ("tune", "--steps", "7", "--compile", "off", "--attention", "sdpa", "--no-measure", "--json")
    out = nightlab(*args, cwd=lab)
    data = json.loads(out.stdout)
    rows = [r for r in data["rows"] if r != data["current"]]
    assert {(r["candidate"]["compile"], r["candidate"]["attention"]) for r in rows} == {("off", "sdpa")}
    bad = nightlab("tune", "--compile", "maybe", cwd=lab, check=False)
    assert bad.returncode == 2 and "compile `maybe`" in bad.stderr


NOISY_TRAIN = FAKE_TRAIN.replace(
    'print(f"tok_per_sec:',
    "import pathlib\n"
    "count = pathlib.Path('count'); n = int(count.read_text()) + 1 if count.exists() else 0\n"
    "count.write_text(str(n))\n"
    "speed = (5000 if COMPILE == 'auto' else 5085) + (150 if n % 2 else -150)  # +1.7 %, +-3 % noise\n"
    'print(f"tok_per_sec:',
).replace("{speed if COMPILE != 'auto' else 1000}", "{speed}")


def test_a_gain_inside_the_spread_is_not_written(lab):
    """Issue 21: a 1.7 % tok/s difference from short noisy runs must not be crowned and committed."""
    (lab / "train.py").write_text(NOISY_TRAIN)
    before = (lab / "train.py").read_bytes()
    result = tune(lab, steps=7, batch_sizes=[4], compiles=["off"], attentions=["sdpa"], progress=False)
    assert result.best.candidate.compile == "off" and result.best.tok_per_sec > result.current.tok_per_sec
    assert result.best.spread > 100 and not result.beats_current and result.written == {}
    assert "within the spread" in result.reason
    assert (lab / "train.py").read_bytes() == before
    # one run each has no spread: nothing is written either
    once = tune(
        lab, steps=7, batch_sizes=[4], compiles=["off"], attentions=["sdpa"], progress=False, repeats=1
    )
    assert not once.beats_current and "no spread" in once.reason and once.written == {}


def test_interval_and_decision():
    from nightlab.harness.tune import Candidate, TuneRow, decide, interval

    mean, half = interval([100.0, 102.0, 98.0])
    assert mean == 100.0 and abs(half - 4.303 * 2.0 / 3**0.5) < 1e-9
    assert interval([5.0]) == (5.0, None)
    cur = TuneRow(Candidate("auto", "auto", 4), "ok", tok_per_sec=1000.0, spread=10.0)
    fast = TuneRow(Candidate("on", "sdpa", 4), "ok", tok_per_sec=1100.0, spread=10.0)
    close = TuneRow(Candidate("on", "sdpa", 8), "ok", tok_per_sec=1015.0, spread=10.0)
    assert decide(fast, cur)[0] and not decide(close, cur)[0]
    assert decide(cur, cur) == (False, "the current setting is the fastest")
    assert decide(fast, TuneRow(cur.candidate, "oom"))[0]


def test_cli_commits_a_real_gain_and_queues_the_tuned_incumbent(tmp_path):
    import json

    from labkit import nightlab
    from nightlab.lab import Lab

    lab = _tune_lab(tmp_path)
    try:
        args = ("tune", "--steps", "7", "--compile", "off", "--attention", "sdpa", "--batch-size", "4")
        out = json.loads(nightlab(*args, "--repeats", "2", "--json", cwd=lab).stdout)
        assert out["beats_current"] and out["commit"] and len(out["measuring"]) == 2
        with Lab(lab) as opened:
            assert opened.head() == out["commit"]
            runs = opened.ledger.experiments(ids=out["measuring"])
            assert {e.identity for e in runs} == {opened.head_identity()} and {e.source for e in runs} == {
                "noise"
            }
        # let the controller the submission started come up (the stand-in's runs end at once), so
        # the stop below cannot race its start
        nightlab("wait", *out["measuring"], "--timeout", "120", cwd=lab)
    finally:
        nightlab("fleet", "stop", cwd=lab, check=False)
