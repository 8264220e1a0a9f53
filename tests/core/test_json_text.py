"""The one JSON encoder of `--json` documents and `/api/*` bodies, and the collector pause."""

from __future__ import annotations

import enum
import gc
import json
import math
import threading
from pathlib import Path

import numpy as np

from nightlab.bulk import gc_paused
from nightlab.views.encode import json_text


def _strict(text: str):
    def refuse(name: str):
        raise AssertionError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def test_nan_and_infinities_are_null_so_every_document_is_strict_json():
    doc = {"a": math.nan, "b": [math.inf, -math.inf, 1.5], "c": {"d": float("nan")}}
    assert _strict(json_text(doc)) == {"a": None, "b": [None, None, 1.5], "c": {"d": None}}


def test_numbers_stay_numbers_and_other_types_become_text():
    class Seconds(float):
        pass

    class Level(enum.Enum):
        HIGH = 3

    class Kind(enum.StrEnum):
        OK = "ok"

    doc = {
        "sub": Seconds(2.5),
        "np": np.float64(0.25),
        "npi": np.int64(7),
        "path": Path("/lab/x"),
        "enum": Level.HIGH,
        "strenum": Kind.OK,
        3: "int key",
        "tuple": (1, 2),
        "big": 2**53 + 1,
    }
    assert _strict(json_text(doc)) == {
        "sub": 2.5,
        "np": 0.25,
        "npi": 7,
        "path": "/lab/x",
        "enum": 3,
        "strenum": "ok",
        "3": "int key",
        "tuple": [1, 2],
        "big": 2**53 + 1,
    }
    assert "\n" not in json_text({"text": "two\nlines"})  # one line: a --json document is one line


def test_the_collector_pause_nests_and_restores_the_state_it_found():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer block is still running
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # it was off before: left off
    finally:
        gc.enable()


def test_the_collector_comes_back_only_when_the_last_thread_leaves():
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with gc_paused():
            inside.set()
            leave.wait(5)

    t = threading.Thread(target=other)
    t.start()
    inside.wait(5)
    with gc_paused():
        pass
    assert not gc.isenabled()  # the other thread is still in its block
    leave.set()
    t.join(5)
    assert gc.isenabled()


def test_an_error_inside_the_block_still_restores_the_collector():
    try:
        with gc_paused():
            raise ValueError("boom")
    except ValueError:
        pass
    assert gc.isenabled()
