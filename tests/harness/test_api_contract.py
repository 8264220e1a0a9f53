"""The harness API is a contract with every lab's train.py, not only with today's template.

`nightlab init` copies the template into the lab, and the lab keeps that copy while nightlab is
upgraded underneath it: a lab once broke when `evaluate()` changed its signature. These tests pin
what the template uses. Changing the harness compatibly (a new keyword with a default, a new field)
passes; removing or renaming a parameter, making it required, or dropping a field fails: keep the
old form working (a shim) before updating this record.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from pathlib import Path

import pytest

import nightlab.targets.gpt as gpt_target

TEMPLATE = Path(gpt_target.__file__).parent / "train.py"

# name -> parameters as (name, kind, has a default), as shipped in the templates labs hold
CALLABLES: dict[str, list[tuple[str, str, bool]]] = {
    "nightlab.harness.accel.detect": [("attention", "KEYWORD_ONLY", True), ("compile", "KEYWORD_ONLY", True)],
    "nightlab.harness.clock.training_batches": [
        ("profile", "POSITIONAL_OR_KEYWORD", False),
        ("batch_size", "POSITIONAL_OR_KEYWORD", False),
        ("device", "POSITIONAL_OR_KEYWORD", False),
        ("seed", "KEYWORD_ONLY", True),
        ("data_dir", "KEYWORD_ONLY", True),
    ],
    "nightlab.harness.handoff.hand_in": [
        ("model", "POSITIONAL_OR_KEYWORD", False),
        ("batches", "POSITIONAL_OR_KEYWORD", False),
        ("batch_size", "KEYWORD_ONLY", True),
        ("folder", "KEYWORD_ONLY", True),
    ],
    "nightlab.harness.data.load_manifest": [
        ("data_dir", "POSITIONAL_OR_KEYWORD", False),
        ("profile", "KEYWORD_ONLY", True),
    ],
    "nightlab.harness.evaluate.evaluate": [
        ("model", "POSITIONAL_OR_KEYWORD", False),
        ("profile", "POSITIONAL_OR_KEYWORD", False),
        ("batch_size", "KEYWORD_ONLY", False),
        ("device", "KEYWORD_ONLY", False),
        ("autocast", "KEYWORD_ONLY", True),
        ("data_dir", "KEYWORD_ONLY", True),
    ],
    "nightlab.harness.loader.train_batches": [
        ("data_dir", "POSITIONAL_OR_KEYWORD", False),
        ("batch_size", "POSITIONAL_OR_KEYWORD", False),
        ("seq_len", "POSITIONAL_OR_KEYWORD", False),
        ("device", "POSITIONAL_OR_KEYWORD", False),
        ("seed", "KEYWORD_ONLY", True),
    ],
    "nightlab.harness.profiles.data_dir": [("profile", "POSITIONAL_OR_KEYWORD", False)],
    "nightlab.harness.profiles.load_lab_profile": [("start", "POSITIONAL_OR_KEYWORD", True)],
    "nightlab.harness.tokenizer.Tokenizer.load": [("data_dir", "POSITIONAL_OR_KEYWORD", False)],
}

# dataclass -> fields the template reads
FIELDS: dict[str, set[str]] = {
    "nightlab.harness.accel.Accel": {
        "device",
        "device_name",
        "dtype",
        "attention_backend",
        "peak_flops",
        "warmup_steps",
    },
    "nightlab.harness.evaluate.EvalResult": {"val_bpb", "invalid_reason", "seconds"},
    "nightlab.harness.clock.ClockFigures": {"training_seconds", "warmup_seconds", "warmup_steps", "steps"},
    "nightlab.harness.handoff.HandIn": {"score"},
    "nightlab.harness.profiles.Profile": {"budget_seconds", "seq_len"},
}

# methods and properties of Accel and Tokenizer the template calls
ATTRIBUTES: dict[str, set[str]] = {
    "nightlab.harness.accel.Accel": {
        "attention",
        "autocast",
        "compile_fn",
        "maybe_compile_model",
        "peak_memory_mb",
        "synchronize",
        "windows_supported",
    },
    "nightlab.harness.tokenizer.Tokenizer": {"load"},
    "nightlab.harness.clock.TrainingClock": {"budget", "progress", "step", "figures", "__next__"},
}


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise AssertionError(f"cannot import {dotted}")


def test_the_record_covers_every_harness_name_the_template_imports():
    imported = set()
    for node in ast.walk(ast.parse(TEMPLATE.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nightlab.harness"):
            imported |= {f"{node.module}.{a.name}" for a in node.names}
    recorded = {name.rsplit(".", 1)[0] if name.endswith(".load") else name for name in CALLABLES}
    assert imported <= recorded, f"record these in the contract: {sorted(imported - recorded)}"


def incompatibilities(dotted: str, signature: inspect.Signature) -> list[str]:
    """How `signature` breaks the recorded calls of `dotted` (empty when old train.py files still work)."""
    params = signature.parameters
    problems = []
    for name, kind, has_default in CALLABLES[dotted]:
        if name not in params:
            problems.append(f"{dotted} lost parameter `{name}`: labs' train.py still pass it")
        elif params[name].kind.name != kind:
            problems.append(f"{dotted}({name}) changed from {kind} to {params[name].kind.name}")
        elif has_default and params[name].default is inspect.Parameter.empty:
            problems.append(f"{dotted}({name}) became required")
    known = {name for name, _, _ in CALLABLES[dotted]}
    for name, p in params.items():
        variadic = p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        if name not in known and not variadic and p.default is inspect.Parameter.empty:
            problems.append(
                f"{dotted} gained a required parameter `{name}`: old train.py files do not pass it"
            )
    return problems


@pytest.mark.parametrize("dotted", sorted(CALLABLES))
def test_harness_callables_stay_call_compatible(dotted):
    assert incompatibilities(dotted, inspect.signature(_resolve(dotted))) == []


@pytest.mark.parametrize("dotted", sorted(FIELDS))
def test_harness_results_keep_their_fields(dotted):
    fields = {f.name for f in dataclasses.fields(_resolve(dotted))}
    assert FIELDS[dotted] <= fields, f"{dotted} lost {sorted(FIELDS[dotted] - fields)}"


@pytest.mark.parametrize("dotted", sorted(ATTRIBUTES))
def test_harness_objects_keep_their_methods(dotted):
    cls = _resolve(dotted)
    missing = sorted(a for a in ATTRIBUTES[dotted] if not hasattr(cls, a))
    assert not missing, f"{dotted} lost {missing}"


def test_a_tokenizer_still_has_a_vocab_size():
    from nightlab.harness.tokenizer import Tokenizer

    ranks = {bytes([b]): b for b in range(256)}
    assert Tokenizer(ranks).vocab_size > 256


def test_a_broken_contract_is_caught():
    """The check itself: dropping a parameter, or adding a required one, is reported."""
    dotted = "nightlab.harness.evaluate.evaluate"

    def dropped(model, profile, *, batch_size, autocast=None, data_dir=None):
        return None

    def required(model, profile, *, batch_size, device, autocast=None, data_dir=None, steps):
        return None

    assert incompatibilities(dotted, inspect.signature(dropped)) == [
        f"{dotted} lost parameter `device`: labs' train.py still pass it"
    ]
    assert "gained a required parameter `steps`" in incompatibilities(dotted, inspect.signature(required))[0]
