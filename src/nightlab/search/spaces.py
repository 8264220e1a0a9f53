"""Search spaces: one `Dimension` per knob, parsed from `NAME=...` specs on the command line.

Accepted forms (SPACE_FORMS):

    NAME=a,b,c          a list of values (Python literals; a bare word is a string: SSSL,L)
    NAME=int(lo,hi)     integers lo..hi inclusive
    NAME=uniform(lo,hi) floats, uniform on [lo, hi]
    NAME=log(lo,hi)     floats, uniform in log scale on [lo, hi] (0 < lo)
    NAME=pow2(lo,hi)    powers of two between lo and hi inclusive; the bounds are values
                        (pow2(16,128) or pow2(2**16,2**19)), not exponents

Every dimension maps its values to a coded level in [-1, +1] on its own scale (linear, log,
log2 or level index) and back. Designs, effect estimates and strategies work on coded levels, so
`2**16 .. 2**19` and `0.01 .. 0.04` look alike to them. Values go back to the script as source
text (`to_source`): powers of two as `2**k`, floats rounded to 6 significant digits so the text
stays readable and re-reads as exactly the value that was measured.

Usage:
    dims = [parse_space(s) for s in ("MATRIX_LR=log(0.01,0.08)", "DEPTH=int(4,12)")]
    check_knobs(dims, list_knobs(train_py_text))
"""

from __future__ import annotations

import ast
import math
import random
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from nightlab.errors import UsageError
from nightlab.search.knobs import Knob, _unknown, mismatch, parse_value

__all__ = [
    "SPACE_FORMS",
    "Choice",
    "Dimension",
    "IntRange",
    "LogUniform",
    "Pow2",
    "Uniform",
    "check_knobs",
    "coded_levels",
    "parse_space",
]

SPACE_FORMS = "NAME=a,b,c | NAME=int(lo,hi) | NAME=uniform(lo,hi) | NAME=log(lo,hi) | NAME=pow2(lo,hi)"

_SPEC = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=(.*)\Z", re.S)
_RANGE = re.compile(r"\s*(int|uniform|log|pow2)\s*\((.*)\)\s*\Z", re.S)
_SIGNIFICANT = 6


def _round(x: float) -> float:
    """Round to 6 significant digits: readable knob text that re-reads as the same float."""
    return float(f"{x:.{_SIGNIFICANT}g}")


def _clip(c: float) -> float:
    return max(-1.0, min(1.0, c))


class Dimension(ABC):
    """One searchable knob. Subclasses are frozen dataclasses with a `name` field.

    The contract: `from_coded(coded(v)) == v` for every value `v` the dimension can produce, and
    `coded` maps the dimension's two extremes to -1 and +1.
    """

    name: str

    @abstractmethod
    def levels(self, n: int) -> list[object]:
        """`n` values evenly spread over the dimension (fewer if it has fewer distinct values)."""

    @abstractmethod
    def sample(self, rng: random.Random) -> object:
        """One value drawn at random."""

    @abstractmethod
    def coded(self, value: object) -> float:
        """The value's coded level in [-1, +1] (values outside the range are clipped)."""

    @abstractmethod
    def from_coded(self, coded: float) -> object:
        """The value at a coded level (clipped to [-1, +1], rounded to a valid value)."""

    @abstractmethod
    def spec(self) -> str:
        """The `NAME=...` text that `parse_space` reads back into this dimension (store it in a wave)."""

    def to_source(self, value: object) -> str:
        """The value as knob source text."""
        if isinstance(value, float):
            return repr(_round(value))
        return repr(value)

    def two_levels(self) -> tuple[object, object]:
        """The low and high values for a two-level design."""
        low, high = self.levels(2)
        return low, high


@dataclass(frozen=True)
class Choice(Dimension):
    """A list of values, kept as the source texts the user wrote."""

    name: str
    sources: tuple[str, ...]

    @cached_property
    def values(self) -> tuple[object, ...]:
        """The evaluated values, in the order given."""
        return tuple(parse_value(s) for s in self.sources)

    def levels(self, n: int | None = None) -> list[object]:
        """All the values: a list has no in-between levels, so `n` is ignored."""
        return list(self.values)

    def two_levels(self) -> tuple[object, object]:
        if len(self.sources) != 2:
            raise UsageError(
                f"`{self.name}` has {len(self.sources)} values; a two-level design needs exactly 2 "
                "(use --design full or random for longer lists)"
            )
        low, high = self.values
        return low, high

    def sample(self, rng: random.Random) -> object:
        return rng.choice(self.values)

    def index(self, value: object) -> int:
        """Position of a value in the list, matching by value (`2**4` matches `16`)."""
        for i, v in enumerate(self.values):
            if v == value and type(v) is type(value):
                return i
        for i, v in enumerate(self.values):
            if v == value:
                return i
        raise UsageError(f"value `{value!r}` is not in the list of `{self.name}`: {', '.join(self.sources)}")

    def coded(self, value: object) -> float:
        # Level index mapped linearly onto [-1, +1]: exact for two values, ordinal beyond.
        return -1.0 + 2.0 * self.index(value) / (len(self.sources) - 1)

    def from_coded(self, coded: float) -> object:
        i = round((_clip(coded) + 1.0) / 2.0 * (len(self.sources) - 1))
        return self.values[i]

    def to_source(self, value: object) -> str:
        return self.sources[self.index(value)]

    def spec(self) -> str:
        return f"{self.name}={','.join(self.sources)}"


@dataclass(frozen=True)
class _Range(Dimension):
    """A numeric interval with a monotone scale; subclasses choose the scale and the rounding."""

    name: str
    lo: float
    hi: float

    def _to_scale(self, x: float) -> float:
        return x

    def _from_scale(self, s: float) -> float:
        return s

    def _snap(self, x: float) -> object:
        return _round(x)

    def coded(self, value: object) -> float:
        a, b = self._to_scale(self.lo), self._to_scale(self.hi)
        return _clip(2.0 * (self._to_scale(float(value)) - a) / (b - a) - 1.0)

    def from_coded(self, coded: float) -> object:
        a, b = self._to_scale(self.lo), self._to_scale(self.hi)
        x = self._from_scale(a + (_clip(coded) + 1.0) / 2.0 * (b - a))
        return self._snap(min(max(x, self.lo), self.hi))

    def levels(self, n: int) -> list[object]:
        if n < 2:
            raise UsageError(f"`{self.name}` needs at least 2 levels, got `{n}`")
        out: list[object] = []
        for i in range(n):
            v = self.from_coded(-1.0 + 2.0 * i / (n - 1))
            if v not in out:
                out.append(v)
        return out

    def sample(self, rng: random.Random) -> object:
        return self.from_coded(rng.uniform(-1.0, 1.0))

    def spec(self) -> str:
        kind = next(k for k, cls in _RANGES.items() if cls is type(self))
        return f"{self.name}={kind}({self.lo!r},{self.hi!r})"


@dataclass(frozen=True)
class IntRange(_Range):
    """Integers lo..hi inclusive, linear scale."""

    def _snap(self, x: float) -> object:
        return int(round(x))

    def sample(self, rng: random.Random) -> object:
        return rng.randint(int(self.lo), int(self.hi))


@dataclass(frozen=True)
class Uniform(_Range):
    """Floats on [lo, hi], linear scale."""


@dataclass(frozen=True)
class LogUniform(_Range):
    """Floats on [lo, hi], log scale (learning rates, weight decays)."""

    def _to_scale(self, x: float) -> float:
        return math.log(x)

    def _from_scale(self, s: float) -> float:
        return math.exp(s)


@dataclass(frozen=True)
class Pow2(_Range):
    """Powers of two from lo to hi (batch sizes); coded on the exponent."""

    def _to_scale(self, x: float) -> float:
        return math.log2(x)

    def _from_scale(self, s: float) -> float:
        return 2.0 ** round(s)

    def _snap(self, x: float) -> object:
        return int(round(x))

    def sample(self, rng: random.Random) -> object:
        return 2 ** rng.randint(int(math.log2(self.lo)), int(math.log2(self.hi)))

    def to_source(self, value: object) -> str:
        return f"2**{int(round(math.log2(float(value))))}"


_RANGES: dict[str, type[_Range]] = {"int": IntRange, "uniform": Uniform, "log": LogUniform, "pow2": Pow2}


def _malformed(spec: str, why: str) -> UsageError:
    return UsageError(f"bad search space `{spec}`: {why}; accepted forms: {SPACE_FORMS}")


MAX_CHOICES = 100  # a longer list is a mistake, and parsing it costs O(n^2) source lookups (1,000: 4 s)


def _list_sources(spec: str, body: str) -> tuple[str, ...]:
    if body.count(",") >= MAX_CHOICES:
        raise _malformed(spec, f"a list takes at most {MAX_CHOICES} values; use a range such as int(lo,hi)")
    try:
        tree = ast.parse(f"[{body}]", mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise _malformed(spec, "the values are not a comma-separated list of literals") from None
    assert isinstance(tree.body, ast.List)
    sources: list[str] = []
    for element in tree.body.elts:
        text = ast.get_source_segment(f"[{body}]", element) or ""
        if isinstance(element, ast.Name):  # a bare word is a string: WINDOW_PATTERN=SSSL,L
            text = repr(element.id)
        try:
            parse_value(text)
        except UsageError:
            raise _malformed(spec, f"`{text}` is not a literal") from None
        sources.append(text)
    return tuple(sources)


def parse_space(spec: str) -> Dimension:
    """Parse one `NAME=...` search-space spec.

    Raises:
        UsageError: the spec is malformed, a range is empty or a list has fewer than two values;
            the message shows the accepted forms.
    """
    match = _SPEC.match(spec)
    if match is None:
        raise _malformed(spec, "expected NAME=...")
    name, body = match.group(1), match.group(2).strip()
    if not body:
        raise _malformed(spec, "no values after `=`")
    ranged = _RANGE.match(body)
    if ranged is None:
        if re.match(r"\s*[A-Za-z_]\w*\s*\(", body):
            word = body.split("(")[0].strip()
            if word in _RANGES:  # `log(0.01,0.08` is a known range with its bracket missing
                raise _malformed(spec, f"`{word}(` has no closing `)`, e.g. `{word}(lo,hi)`")
            raise _malformed(spec, f"unknown range `{word}`")
        sources = _list_sources(spec, body)
        if len(sources) < 2:
            raise _malformed(spec, "a list needs at least 2 values (a single value is --set NAME=VALUE)")
        values = [parse_value(s) for s in sources]
        if any(values.count(v) > 1 for v in values):
            raise _malformed(spec, "a value is listed twice")
        return Choice(name, sources)
    kind, args = ranged.group(1), ranged.group(2)
    try:
        bounds = parse_value(f"({args},)")
    except UsageError:
        bounds = None
    if (
        not isinstance(bounds, tuple)
        or len(bounds) != 2
        or not all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds)
    ):
        raise _malformed(spec, f"{kind}(lo,hi) needs two numbers")
    lo, hi = bounds
    if not all(math.isfinite(b) for b in bounds):  # `1e309` reads as inf
        raise _malformed(spec, f"{kind}(lo,hi) needs finite bounds")
    if not lo < hi:
        raise _malformed(spec, f"need lo < hi, got lo={lo!r}, hi={hi!r}")
    if kind == "int" and not (float(lo).is_integer() and float(hi).is_integer()):
        raise _malformed(spec, "int(lo,hi) needs integer bounds")
    if kind in ("log", "pow2") and lo <= 0:
        raise _malformed(spec, f"{kind}(lo,hi) needs 0 < lo")
    if kind == "pow2":
        for b in (lo, hi):
            if not (float(b).is_integer() and int(b) & (int(b) - 1) == 0):
                raise _malformed(spec, f"pow2 bounds are values and must be powers of two, `{b!r}` is not")
    if kind in ("int", "pow2"):
        lo, hi = int(lo), int(hi)
    return _RANGES[kind](name, lo, hi)


def _compatible(knob: Knob, dim: Dimension) -> str | None:
    """Why a dimension cannot drive a knob, or None when it can."""
    if knob.type in ("expr", "none"):
        return None
    if isinstance(dim, (Uniform, LogUniform)) and knob.type != "float":
        return f"is {knob.type} `{knob.source}`; use int(lo,hi), pow2(lo,hi) or a list"
    if isinstance(dim, (IntRange, Pow2)) and knob.type not in ("int", "float"):
        return f"is {knob.type} `{knob.source}`; use a list of values"
    if isinstance(dim, Choice):
        for source, value in zip(dim.sources, dim.values, strict=True):
            if mismatch(knob, value) is not None:  # the rule `submit --set` follows too
                kind = "none" if value is None else type(value).__name__
                return f"is {knob.type} `{knob.source}` but the list has {kind} `{source}`"
    return None


def check_knobs(dims: Sequence[Dimension], knobs: Sequence[Knob]) -> None:
    """Check that every dimension names a distinct knob of the script, of a fitting type.

    Raises:
        UsageError: an unknown knob (known ones listed, closest first), a knob given twice, or a
            range over a knob of another type (`uniform` over an int, a number list over a string).
    """
    by_name = {k.name: k for k in knobs}
    seen: set[str] = set()
    for dim in dims:
        if dim.name in seen:
            raise UsageError(f"knob `{dim.name}` has two search spaces; give one")
        seen.add(dim.name)
        if dim.name not in by_name:
            raise _unknown(dim.name, list(by_name))
        why = _compatible(by_name[dim.name], dim)
        if why is not None:
            raise UsageError(f"knob `{dim.name}` {why}")


def coded_levels(dims: Sequence[Dimension], knobs: Mapping[str, str]) -> dict[str, float]:
    """The coded level of every dimension in one run, from its knob source text.

    Use it for runs not produced by a `Design` (Optuna proposals, agent edits) before `effects`.

    Raises:
        UsageError: a dimension's knob is missing from `knobs` or holds a value outside a list.
    """
    out = {}
    for dim in dims:
        if dim.name not in knobs:
            raise UsageError(f"the run has no value for knob `{dim.name}`; check the wave's spaces")
        out[dim.name] = dim.coded(parse_value(knobs[dim.name]))
    return out
