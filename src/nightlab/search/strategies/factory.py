"""`make_strategy`: a strategy by its name, as `nightlab search --strategy NAME` asks for it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nightlab.errors import UsageError
from nightlab.search.spaces import Dimension
from nightlab.search.strategies._base import BaseStrategy
from nightlab.search.strategies.bayesian import OptunaStrategy
from nightlab.search.strategies.factorial import FactorialStrategy
from nightlab.search.strategies.greedy import GreedyStrategy
from nightlab.search.strategies.pattern import PatternStrategy

__all__ = ["make_strategy"]


def make_strategy(name: str, dims: Sequence[Dimension], **options: Any) -> BaseStrategy:
    """The strategy called `name` (`factorial`, `optuna`, `greedy`, `pattern`, `surface`).

    Raises:
        UsageError: an unknown name.
    """
    from nightlab.search.strategies.surface import SurfaceStrategy  # numpy: loaded when asked for

    for cls in (FactorialStrategy, OptunaStrategy, GreedyStrategy, PatternStrategy, SurfaceStrategy):
        if cls.name == name:
            return cls(dims, **options)
    raise UsageError(f"unknown strategy `{name}`; use factorial, optuna, greedy, pattern or surface")
