"""Experiment designs: which knob settings a wave runs.

- `full_factorial`: every combination of every dimension's levels (lists: all their values;
  ranges: `levels` evenly spread values, two by default).
- `fractional_factorial`: a two-level 2^(k-p) fraction with a requested or chosen resolution.
  Resolution III keeps main effects clear of each other, IV also clear of two-way interactions,
  V keeps two-way interactions clear of each other. The design matrix comes from pyDOE3's
  `fracfact(generator)`; the generator is found here because pyDOE3's own `fracfact_by_res` never
  uses the product of all base factors and so misses standard designs (it cannot build the
  4-run 2^(3-1) III or the 8-run 2^(4-1) IV, and needs 16 runs for 7 factors at III where 8 do).
  The search takes the fewest runs that reach the resolution, preferring long generator words.
- `random_design`: independent draws from each dimension.

Every design returns the runs as knob -> source text (what `set_knobs` writes) and the coded
level of every factor in every run (-1/+1 for two levels), which is what `effects` fits.

Usage:
    design = fractional_factorial([parse_space(s) for s in specs], resolution=4)
    for knobs, coded in zip(design.runs, design.coded): ...
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nightlab.errors import UsageError
from nightlab.search.spaces import Dimension

__all__ = [
    "DESIGNS",
    "Design",
    "fractional_factorial",
    "full_factorial",
    "make_design",
    "min_two_level_runs",
    "random_design",
    "two_level_design",
]

DESIGNS = ("full", "fractional", "random")

_ROMAN = {3: "III", 4: "IV", 5: "V", 6: "VI", 7: "VII", 8: "VIII"}
# A depth-first search over generator columns; beyond this many nodes it moves on to twice the runs.
_SEARCH_BUDGET = 50_000


@dataclass(frozen=True)
class Design:
    """The runs of a wave.

    Attributes:
        kind: `full`, `fractional` or `random`.
        factors: the knob names, in the order of the dimensions.
        runs: one dict per run: knob -> value as source text.
        coded: one dict per run: knob -> coded level in [-1, +1].
        resolution: the achieved resolution of a fractional design (None otherwise).
        generators: the pyDOE3 generator string of a fractional design, letters in factor order.
        aliases: for a fractional design, the main effects and two-way interactions that share a
            column, e.g. `DEPTH = MATRIX_LR:WARMUP`.
    """

    kind: str
    factors: tuple[str, ...]
    runs: tuple[dict[str, str], ...]
    coded: tuple[dict[str, float], ...]
    resolution: int | None = None
    generators: str | None = None
    aliases: tuple[str, ...] = field(default=())

    def __len__(self) -> int:
        return len(self.runs)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (for a wave's spec in the ledger); `Design.from_dict` reads it back."""
        return {
            "kind": self.kind,
            "factors": list(self.factors),
            "runs": [dict(r) for r in self.runs],
            "coded": [dict(c) for c in self.coded],
            "resolution": self.resolution,
            "generators": self.generators,
            "aliases": list(self.aliases),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Design:
        """The design stored by `to_dict`."""
        return cls(
            kind=data["kind"],
            factors=tuple(data["factors"]),
            runs=tuple(dict(r) for r in data["runs"]),
            coded=tuple({k: float(v) for k, v in c.items()} for c in data["coded"]),
            resolution=data.get("resolution"),
            generators=data.get("generators"),
            aliases=tuple(data.get("aliases", ())),
        )

    def describe(self) -> str:
        """One line: kind, runs, factors and (for fractions) the resolution."""
        text = f"{self.kind} design, {len(self.runs)} runs, {len(self.factors)} factors"
        if self.resolution is not None:
            text += f", resolution {_ROMAN.get(self.resolution, str(self.resolution))}"
        return text


def _check_dims(dims: Sequence[Dimension]) -> None:
    if not dims:
        raise UsageError("empty design: give at least one search space, e.g. `MATRIX_LR=log(0.01,0.08)`")
    names = [d.name for d in dims]
    for name in names:
        if names.count(name) > 1:
            raise UsageError(f"knob `{name}` has two search spaces; give one")


def _too_many(runs: int, max_runs: int) -> UsageError:
    return UsageError(
        f"the design has `{runs}` runs, more than the limit of {max_runs}; "
        "use fewer levels or factors, --design fractional or --design random"
    )


def full_factorial(dims: Sequence[Dimension], *, levels: int = 2, max_runs: int = 1024) -> Design:
    """Every combination of the dimensions' levels.

    Args:
        dims: the search space.
        levels: values per range dimension (lists always use all their values).
        max_runs: refuse designs larger than this.

    Raises:
        UsageError: no dimensions, or more than `max_runs` runs.
    """
    _check_dims(dims)
    per_dim = [d.levels(levels) for d in dims]
    size = 1
    for values in per_dim:
        size *= len(values)
    if size > max_runs:
        raise _too_many(size, max_runs)
    runs, coded = [], []
    for combo in itertools.product(*per_dim):
        runs.append({d.name: d.to_source(v) for d, v in zip(dims, combo, strict=True)})
        coded.append({d.name: d.coded(v) for d, v in zip(dims, combo, strict=True)})
    return Design("full", tuple(d.name for d in dims), tuple(runs), tuple(coded))


# --- fractional factorial: generator search -----------------------------------------------
# Columns are bitmasks over the m base factors: bit i set = base factor i takes part in the
# product. A set of columns whose XOR is 0 is a word of the defining relation; the resolution
# is the length of the shortest word.


def _search_columns(m: int, extra: int, resolution: int) -> list[int] | None:
    """`extra` generated columns over `m` base factors with no word shorter than `resolution`."""
    base = [1 << i for i in range(m)]
    # Longer words first: fewer short words in the defining relation (less aberration).
    candidates = sorted(
        (c for c in range(1, 1 << m) if bin(c).count("1") >= max(2, resolution - 1)),
        key=lambda c: (-bin(c).count("1"), c),
    )
    depth = resolution - 2  # a new column may not equal the XOR of this many chosen columns or fewer
    nodes = 0

    def sums_with(sums: list[set[int]], v: int) -> list[set[int]]:
        # sums[j] = XORs of at most j chosen columns; sums[j] includes sums[j - 1].
        out = [sums[0]]
        for j in range(1, depth + 1):
            out.append(sums[j] | {v ^ s for s in sums[j - 1]})
        return out

    def dfs(start: int, chosen: list[int], sums: list[set[int]]) -> list[int] | None:
        nonlocal nodes
        if len(chosen) == extra:
            return chosen
        for i in range(start, len(candidates)):
            nodes += 1
            if nodes > _SEARCH_BUDGET or len(candidates) - i < extra - len(chosen):
                return None
            v = candidates[i]
            if v in sums[depth]:
                continue
            found = dfs(i + 1, [*chosen, v], sums_with(sums, v))
            if found is not None:
                return found
        return None

    sums: list[set[int]] = [{0} for _ in range(depth + 1)]  # the empty XOR is 0 at every size
    for b in base:
        sums = sums_with(sums, b)
    return dfs(0, [], sums)


def _generators(k: int, resolution: int) -> tuple[int, list[int]] | None:
    """The fewest base factors m < k (2^m runs) admitting a fraction of that resolution."""
    for m in range(1, k):
        if (1 << m) - 1 < k:
            continue
        columns = _search_columns(m, k - m, resolution)
        if columns is not None:
            return m, columns
    return None


def _resolution(m: int, columns: list[int]) -> int:
    """Length of the shortest word in the defining relation."""
    words = [c | (1 << (m + i)) for i, c in enumerate(columns)]
    best = None
    for r in range(1, len(words) + 1):
        for subset in itertools.combinations(words, r):
            w = 0
            for x in subset:
                w ^= x
            length = bin(w).count("1")
            best = length if best is None else min(best, length)
    assert best is not None
    return best


def _aliases(matrix: list[list[float]], names: Sequence[str]) -> tuple[str, ...]:
    """Groups of main effects and two-way interactions that share one column (up to sign)."""
    k = len(names)
    terms: list[tuple[str, tuple[int, ...]]] = [(n, (i,)) for i, n in enumerate(names)]
    terms += [(f"{names[i]}:{names[j]}", (i, j)) for i, j in itertools.combinations(range(k), 2)]
    groups: dict[tuple[float, ...], list[str]] = {}
    for label, idx in terms:
        col = tuple(_product(row, idx) for row in matrix)
        key = col if col[0] > 0 else tuple(-x for x in col)
        groups.setdefault(key, []).append(label)
    return tuple(" = ".join(g) for g in groups.values() if len(g) > 1)


def _product(row: list[float], idx: tuple[int, ...]) -> float:
    out = 1.0
    for i in idx:
        out *= row[i]
    return out


def _roman(resolution: int) -> str:
    return _ROMAN.get(resolution, str(resolution))


def fractional_factorial(
    dims: Sequence[Dimension], *, resolution: int | None = None, max_runs: int = 1024
) -> Design:
    """A two-level fractional factorial design.

    Args:
        dims: the search space; each dimension contributes two levels (`two_levels()`: a range's
            ends, or a list of exactly two values).
        resolution: the least resolution wanted (3 or more). None chooses: the fewest runs that
            give resolution IV (III when no fraction reaches IV), then the highest resolution
            those runs allow.
        max_runs: refuse designs larger than this.

    Raises:
        UsageError: fewer than 3 factors (no fraction exists), a list without exactly two values,
            a resolution below III, or no fraction with that resolution.
    """
    from pyDOE3 import fracfact

    _check_dims(dims)
    k = len(dims)
    levels = [d.two_levels() for d in dims]
    if k < 3:
        raise UsageError(
            f"a fractional design needs at least 3 two-level factors, got `{k}`; use --design full"
        )
    if resolution is not None and resolution < 3:
        raise UsageError(f"resolution `{resolution}` aliases main effects with each other; ask for 3 or more")
    if resolution is None:
        found = _generators(k, 4)
        target = 4
        if found is None:
            found, target = _generators(k, 3), 3
        assert found is not None  # k >= 3 always has a resolution III fraction
        while (better := _generators(k, target + 1)) is not None and better[0] == found[0]:
            found, target = better, target + 1
    else:
        found = _generators(k, resolution)
        if found is None:
            raise UsageError(
                f"no fraction of the 2^{k} design has resolution `{_roman(resolution)}`; "
                f"use --design full ({2**k} runs) or a lower resolution"
            )
    m, columns = found
    if 1 << m > max_runs:
        raise _too_many(1 << m, max_runs)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = list(letters[:m]) + ["".join(letters[i] for i in range(m) if c >> i & 1) for c in columns]
    generator = " ".join(words)
    matrix = fracfact(generator).tolist()
    names = tuple(d.name for d in dims)
    runs, coded = [], []
    for row in matrix:
        values = [lv[0] if x < 0 else lv[1] for lv, x in zip(levels, row, strict=True)]
        runs.append({d.name: d.to_source(v) for d, v in zip(dims, values, strict=True)})
        coded.append({n: float(x) for n, x in zip(names, row, strict=True)})
    return Design(
        "fractional",
        names,
        tuple(runs),
        tuple(coded),
        resolution=_resolution(m, columns),
        generators=generator,
        aliases=_aliases(matrix, names),
    )


def min_two_level_runs(k: int) -> int:
    """The runs of the smallest two-level design over `k` factors (a resolution III fraction, or the full one)."""
    smallest = _generators(k, 3)
    return min(1 << smallest[0], 1 << k) if smallest else 1 << k


def two_level_design(dims: Sequence[Dimension], *, max_runs: int) -> Design:
    """The most informative two-level design with at most `max_runs` runs.

    The full factorial when it fits, else the highest-resolution fraction that fits.

    Raises:
        UsageError: even the smallest resolution III fraction needs more than `max_runs` runs.
    """
    _check_dims(dims)
    k = len(dims)
    if 1 << k <= max_runs:
        for d in dims:
            d.two_levels()  # a list must have exactly two values here too
        return full_factorial(dims, levels=2, max_runs=max_runs)
    best = None
    for resolution in range(3, k + 1):
        found = _generators(k, resolution)
        if found is None or 1 << found[0] > max_runs:
            break
        best = resolution
    if best is None:
        runs = min_two_level_runs(k)
        raise UsageError(
            f"a wave of `{max_runs}` runs is too small for {k} two-level factors; "
            f"a resolution III design needs {runs}: raise --wave-size to {runs} or use fewer knobs"
        )
    return fractional_factorial(dims, resolution=best, max_runs=max_runs)


def random_design(dims: Sequence[Dimension], n: int, *, seed: int = 0) -> Design:
    """`n` runs drawn at random, distinct while the space allows it.

    Raises:
        UsageError: no dimensions or `n` < 1.
    """
    _check_dims(dims)
    if n < 1:
        raise UsageError(f"a random design needs at least 1 run, got `{n}`; pass --repeats or a size >= 1")
    rng = random.Random(seed)
    runs: list[dict[str, str]] = []
    coded: list[dict[str, float]] = []
    draws = 0
    # Small spaces run out of new combinations; after 20 tries per run, duplicates are allowed.
    while len(runs) < n:
        values = [d.sample(rng) for d in dims]
        run = {d.name: d.to_source(v) for d, v in zip(dims, values, strict=True)}
        draws += 1
        if run in runs and draws < 20 * n:
            continue
        runs.append(run)
        coded.append({d.name: d.coded(v) for d, v in zip(dims, values, strict=True)})
    return Design("random", tuple(d.name for d in dims), tuple(runs), tuple(coded))


def make_design(
    kind: str,
    dims: Sequence[Dimension],
    *,
    size: int | None = None,
    resolution: int | None = None,
    seed: int = 0,
    levels: int = 2,
) -> Design:
    """The design `nightlab sweep --design KIND` asks for.

    Args:
        kind: `full`, `fractional` or `random` (`optuna` is a strategy: see `OptunaStrategy`).
        size: runs of a random design (required for `random`).
        resolution: least resolution of a fractional design (None: chosen).
        seed: seed of a random design.
        levels: values per range dimension of a full design.

    Raises:
        UsageError: an unknown kind, a random design without a size, or what the design refuses.
    """
    if kind == "full":
        return full_factorial(dims, levels=levels)
    if kind == "fractional":
        return fractional_factorial(dims, resolution=resolution)
    if kind == "random":
        if size is None:
            raise UsageError("a random design needs a size; pass --size N")
        return random_design(dims, size, seed=seed)
    raise UsageError(f"unknown design `{kind}`; use full, fractional, random or optuna")
