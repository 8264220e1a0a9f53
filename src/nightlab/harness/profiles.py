"""Profiles: the fixed constants of a lab (dataset, vocab, sequence length, budget, eval size).

A profile is chosen once, at `nightlab init --profile NAME`, and written to the `[profile]`
table of `nightlab.toml`. Results are comparable only between runs under the same
profile, so nothing here changes after init.

The data a profile needs lives in one directory per *fingerprint*: a short hash of
everything that decides which tokens a run sees and how it is scored (dataset identity,
vocab size, sequence length, eval tokens, tokenizer version, split pattern, special
tokens). The budget is deliberately left out: `--budget` changes how long a run trains,
not what it trains or is measured on, so labs that differ only in budget share one cache.

This module is imported by the fleet runner to check every result's `data_fingerprint`,
so it uses the standard library only (no numpy, no torch).

Usage:
    >>> p = get_profile("cpu")
    >>> p.seq_len, p.dataset
    (256, 'demo')
    >>> len(fingerprint(p))
    16
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from nightlab.errors import ConfigError, NotALabError, UsageError

__all__ = [
    "BOS_TOKEN",
    "CLIMBMIX_DEFAULT_SHARDS",
    "CLIMBMIX_MAX_TRAIN_SHARDS",
    "DATA_FORMAT_VERSION",
    "DATA_ROOT_ENV",
    "PROFILES",
    "SOURCE_VERSIONS",
    "SPECIAL_TOKENS",
    "SPLIT_PATTERN",
    "TOKENIZER_VERSION",
    "Profile",
    "data_dir",
    "data_root",
    "fingerprint",
    "get_profile",
    "load_lab_profile",
    "parse_dataset",
    "source_version",
]

# ---------------------------------------------------------------------------
# Fixed tokenizer and cache constants. DO NOT CHANGE without bumping the versions:
# every one of them is part of the fingerprint, so a change makes old caches and old
# results visibly incomparable instead of silently wrong.

# GPT-4's split pattern (cl100k_base) with one change, as nanochat makes it: numbers split
# into groups of at most 2 digits (`\p{N}{1,2}`) instead of 3. With a vocab of a few thousand
# tokens, 3-digit groups would spend ~1000 merges on numbers; 2 digits cost at most 100.
SPLIT_PATTERN = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
# Reserved special tokens, appended after the BPE merges (ids vocab_size - len .. vocab_size - 1).
# Only BOS is used by the harness: it starts every document, and so every packed row.
BOS_TOKEN = "<|bos|>"
SPECIAL_TOKENS = (BOS_TOKEN, "<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>")
TOKENIZER_VERSION = 1  # bump when tokenizer training changes (text sample, rustbpe settings)
DATA_FORMAT_VERSION = 1  # bump when a source, the demo generator, the split or the cache layout changes
# A source whose split changed while labs were using it gets a version of its own, so the change
# reaches only its labs: the version enters the fingerprint (a new data folder: `nightlab prepare`
# again) and the lab's comparison epoch (`identity.measurement`), so results measured on the old
# split are never pooled with new ones. demo 2: validation documents drawn from a secret made at
# prepare, which package code cannot regenerate (issue 30).
SOURCE_VERSIONS = {"demo": 2}
DATA_ROOT_ENV = "NIGHTLAB_DATA_DIR"  # where every profile's data lives (`data_root`)

# Training shards downloaded for plain `climbmix` (autoresearch's default); `climbmix:N` asks for N.
CLIMBMIX_DEFAULT_SHARDS = 10
CLIMBMIX_MAX_TRAIN_SHARDS = 6542  # shards 0..6541 train; 6542, the last, is the pinned validation shard

# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Profile:
    """The fixed constants of a lab.

    Attributes:
        name: `h100`, `small-gpu`, `cpu`, or any name for a custom profile.
        dataset: `climbmix`, `climbmix:N` (N training shards), `tinystories`, `demo`, or `local:/abs/path`.
        vocab_size: tokenizer size, special tokens included.
        seq_len: tokens per training/eval row (the model's context length).
        budget_seconds: training wall-clock budget, start-up and compilation excluded.
        eval_tokens: target tokens scored by the validation metric.
        train_defaults: UPPERCASE knob -> Python literal source, applied to `train.py` at init.
    """

    name: str
    dataset: str
    vocab_size: int
    seq_len: int
    budget_seconds: float
    eval_tokens: int
    train_defaults: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The `[profile]` table of `nightlab.toml` (TOML-serialisable values only)."""
        return {
            "name": self.name,
            "dataset": self.dataset,
            "vocab_size": self.vocab_size,
            "seq_len": self.seq_len,
            "budget_seconds": float(self.budget_seconds),
            "eval_tokens": self.eval_tokens,
            "train_defaults": dict(self.train_defaults),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Profile:
        """Build a profile from a `[profile]` table, checking every key.

        Raises:
            ConfigError: naming the first unknown, missing or mistyped key.
        """
        if not isinstance(d, dict):
            raise ConfigError("nightlab.toml: `profile` must be a table")
        known = {
            "name",
            "dataset",
            "vocab_size",
            "seq_len",
            "budget_seconds",
            "eval_tokens",
            "train_defaults",
        }
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(
                f"nightlab.toml: unknown key `profile.{unknown[0]}`; known keys: {', '.join(sorted(known))}"
            )
        name = _field(d, "name", str)
        dataset = _field(d, "dataset", str)
        try:
            parse_dataset(dataset)
        except UsageError as e:
            raise ConfigError(f"nightlab.toml: `profile.dataset`: {e}") from e
        vocab_size = _field(d, "vocab_size", int)
        seq_len = _field(d, "seq_len", int)
        budget = float(_field(d, "budget_seconds", (int, float)))
        eval_tokens = _field(d, "eval_tokens", int)
        defaults = d.get("train_defaults", {})
        if not isinstance(defaults, dict) or not all(
            isinstance(k, str) and k.isupper() and isinstance(v, str) for k, v in defaults.items()
        ):
            raise ConfigError(
                "nightlab.toml: `profile.train_defaults` must map UPPERCASE knob names to "
                'Python literal strings, e.g. `DEPTH = "4"`'
            )
        for key, value, minimum in (
            ("vocab_size", vocab_size, len(SPECIAL_TOKENS) + 256),
            ("seq_len", seq_len, 8),
            ("eval_tokens", eval_tokens, 1),
        ):
            if value < minimum:
                raise ConfigError(f"nightlab.toml: `profile.{key}` must be at least {minimum}, got `{value}`")
        if budget <= 0:
            raise ConfigError(f"nightlab.toml: `profile.budget_seconds` must be positive, got `{budget}`")
        return cls(name, dataset, vocab_size, seq_len, budget, eval_tokens, dict(defaults))


def _field(d: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in d:
        raise ConfigError(f"nightlab.toml: missing key `profile.{key}`")
    value = d[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) or not isinstance(value, kinds):
        want = " or ".join({str: "a string", int: "an integer", float: "a number"}[k] for k in kinds)
        raise ConfigError(f"nightlab.toml: `profile.{key}` must be {want}, got `{value!r}`")
    return value


# The built-in profiles. `h100` is autoresearch's setup, number for number.
PROFILES: dict[str, Profile] = {
    "h100": Profile(
        name="h100",
        dataset="climbmix",
        vocab_size=8192,
        seq_len=2048,
        budget_seconds=300.0,
        eval_tokens=40 * 524288,
        train_defaults={"DEPTH": "8", "DEVICE_BATCH_SIZE": "128", "TOTAL_BATCH_SIZE": "2**19"},
    ),
    # Consumer cards (8-32 GB): TinyStories is learnable by small models in minutes, and a
    # 512-token context with 4k vocab keeps a depth-4 model's activations in a few GB.
    # Eval 2**21 tokens (~15 s on a mid-range card) still gives a stable metric.
    "small-gpu": Profile(
        name="small-gpu",
        dataset="tinystories",
        vocab_size=4096,
        seq_len=512,
        budget_seconds=300.0,
        eval_tokens=2**21,
        train_defaults={"DEPTH": "4", "DEVICE_BATCH_SIZE": "32", "TOTAL_BATCH_SIZE": "2**16"},
    ),
    # Two CPU cores, offline: the generated demo corpus, a vocab just big enough to cover its
    # words (most become single tokens), 30 s of training and 2**15 eval tokens: 128 rows,
    # scored in a few seconds (2**16 took 8-12 s on the loaded 2-core dev box, a third of the
    # budget). The eval rows are the same for every run, so a small set still ranks runs.
    # Measured there (30 s, ~30 steps of 2**11 tokens): template defaults val_bpb 0.75,
    # Muon/embedding LRs 20x lower 1.07; a bigram model of the corpus scores 0.90.
    "cpu": Profile(
        name="cpu",
        dataset="demo",
        vocab_size=1024,
        seq_len=256,
        budget_seconds=30.0,
        eval_tokens=2**15,
        train_defaults={"DEPTH": "2", "DEVICE_BATCH_SIZE": "8", "TOTAL_BATCH_SIZE": "2**11"},
    ),
}


def parse_dataset(spec: str) -> tuple[str, str | int | None]:
    """Split a dataset spec into (source, argument).

    Returns:
        ("climbmix", n_train_shards), ("tinystories", None), ("demo", None) or ("local", "/abs/path").

    Raises:
        UsageError: for an unknown source or a bad argument.
    """
    source, sep, arg = spec.partition(":")
    if source == "climbmix":
        if not sep:
            return "climbmix", CLIMBMIX_DEFAULT_SHARDS
        if not arg.isdigit() or not 1 <= int(arg) <= CLIMBMIX_MAX_TRAIN_SHARDS:
            raise UsageError(
                f"dataset `{spec}`: the shard count must be 1..{CLIMBMIX_MAX_TRAIN_SHARDS}, e.g. `climbmix:10`"
            )
        return "climbmix", int(arg)
    if source in ("tinystories", "demo") and not sep:
        return source, None
    if source == "local" and arg:
        return "local", arg
    raise UsageError(
        f"unknown dataset `{spec}`; use `climbmix`, `climbmix:N`, `tinystories`, `demo` or `local:PATH`"
    )


def get_profile(name: str, *, budget: float | None = None, dataset: str | None = None) -> Profile:
    """A built-in profile, with the `--budget` / `--dataset` overrides of `nightlab init` applied.

    A `local:` dataset path is made absolute, so the profile means the same from any directory.

    Raises:
        UsageError: for an unknown profile name, a non-positive budget or a bad dataset spec.
    """
    if name not in PROFILES:
        raise UsageError(f"unknown profile `{name}`; known profiles: {', '.join(PROFILES)}")
    profile = PROFILES[name]
    if budget is not None:
        if not budget > 0:
            raise UsageError(f"budget `{budget}` must be a positive number of seconds")
        profile = replace(profile, budget_seconds=float(budget))
    if dataset is not None:
        source, arg = parse_dataset(dataset)
        if source == "local":
            dataset = "local:" + str(Path(str(arg)).expanduser().resolve())
        profile = replace(profile, dataset=dataset)
    return profile


def fingerprint(profile: Profile) -> str:
    """Short hex digest of everything that decides the tokens a run sees and how it is scored.

    Covers the dataset identity, vocab size, sequence length, eval tokens and the tokenizer
    (version, split pattern, special tokens); not the budget and not `train_defaults`.
    """
    source, arg = parse_dataset(profile.dataset)
    identity = {
        "dataset": [source, arg],
        "data_format": DATA_FORMAT_VERSION,
        "vocab_size": profile.vocab_size,
        "seq_len": profile.seq_len,
        "eval_tokens": profile.eval_tokens,
        "tokenizer": [TOKENIZER_VERSION, SPLIT_PATTERN, list(SPECIAL_TOKENS)],
    }
    if source in SOURCE_VERSIONS:  # only then: every other source keeps its fingerprint
        identity["source_version"] = SOURCE_VERSIONS[source]
    blob = json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def source_version(dataset: str) -> int | None:
    """The dataset's source version (`SOURCE_VERSIONS`), None for a source that never changed its split."""
    try:
        source, _ = parse_dataset(dataset)
    except UsageError:  # an unparsable spec is reported where the profile is loaded, not here
        return None
    return SOURCE_VERSIONS.get(source)


def data_root() -> Path:
    """`$NIGHTLAB_DATA_DIR`, else `~/.cache/nightlab/data`: the parent of every profile's data directory."""
    env = os.environ.get(DATA_ROOT_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "nightlab" / "data"


def data_dir(profile: Profile) -> Path:
    """Where `nightlab prepare` puts this profile's data: `data_root() / fingerprint(profile)`."""
    return data_root() / fingerprint(profile)


def load_lab_profile(start: Path | None = None) -> Profile:
    """Read the `[profile]` table of the `nightlab.toml` in `start` (default: the working directory).

    `train.py` runs inside a materialised snapshot, which carries the lab's `nightlab.toml`.
    Parent directories are searched too, so a script run from a lab's subdirectory works.

    Raises:
        NotALabError: when no `nightlab.toml` is found.
        ConfigError: when it has no `[profile]` table or the table is invalid.
    """
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        path = folder / "nightlab.toml"
        if path.is_file():
            break
    else:
        raise NotALabError(
            f"no nightlab.toml in `{here}` or its parents; run `nightlab init --profile cpu` to create a lab"
        )
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"`{path}` is not valid TOML: {e}") from e
    if "profile" not in doc:
        raise ConfigError(
            f"`{path}` has no [profile] table; only labs made with `nightlab init --profile NAME` "
            "use the built-in harness"
        )
    return Profile.from_dict(doc["profile"])
