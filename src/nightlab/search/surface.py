"""The old import path of the `surface` strategy: it lives in `nightlab.search.strategies.surface`."""

from nightlab.search.strategies.surface import SurfaceStrategy, _box_minimum, _fit, _positive_definite

__all__ = ["SurfaceStrategy", "_box_minimum", "_fit", "_positive_definite"]
