"""The `surface` strategy: a quadratic response surface with interactions, fitted on every run.

Pattern search (`pattern.PatternStrategy`) sees each knob on its own, so knobs that act
together (a learning rate whose best value moves with the weight decay) cost it a wave per zig-zag
down the valley. This strategy fits one model on all the search's runs, in coded units centred on
the incumbent x0:

    f(x0 + d) = a + g.d + 1/2 d'Hd          (H holds the curvatures and the interactions)

by Bayesian least squares: the intercept, slopes and curvatures are free; each interaction H_ij
has a prior N(0, (coupling * sqrt(h_i h_j))^2) scaled by the curvatures of a model without
interactions, so an interaction nobody measured stays near 0 and a measured one is believed.
Runs far from the incumbent weigh less (a Gaussian kernel of width `locality`), because real
metrics are only locally quadratic. The predicted best point minimises the model (its Hessian
made positive definite) inside a box of half-width `radius` around the incumbent.

Each wave measures that point `replicas` times (its mean is what the loop judges), plus the runs
that best reduce the model's uncertainty along the move: pair corners (two knobs moved at once,
which measure H_ij) for the pairs whose interaction could shift the prediction most, and a
stencil (one knob up and down) for the knobs whose effect over their reach is least known.
The first wave is a stencil around the incumbent. The radius grows after a wave whose predicted point was adopted,
halves after a wave without an adoption, and the search stops once it is below `min_radius`.
When the model promises less than 4 noise sd, the point gets `endgame_replicas` runs: near the
optimum only a mean of several runs can show a gain.

Everything is rebuilt from the history (the radius from which waves adopted their predicted
point), so a resumed search proposes what the uninterrupted one would have. Tuned on
bench/search_sim.py (the figures: bench/RESULTS.md).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from nightlab.errors import UsageError
from nightlab.search.decide import pooled_sd
from nightlab.search.knobs import parse_value
from nightlab.search.spaces import Dimension
from nightlab.search.strategies._base import (
    BaseStrategy,
    Knobs,
    Observation,
    _key,
    _step_value,
    replicate_groups,
    stencil,
)

__all__ = ["SurfaceStrategy"]


class SurfaceStrategy(BaseStrategy):
    """Response-surface search: a quadratic model with interactions, and designs that feed it.

    Args:
        first_step: the first wave's stencil half-width in coded units ([-1, +1] is the space).
        step: the smallest half-width of later stencils and pair corners (at most the radius).
        effect, max_step: a knob's stencil and corner half-width is the one at which its fitted
            curvature changes the metric by `effect` noise sd, between `step` and `max_step`.
        radius: the first trust region's half-width around the incumbent.
        grow, shrink: radius factors after an adopted prediction and after a wave with no adoption.
        max_radius, min_radius: the radius never grows past the first; the search stops below the second.
        coupling: prior scale of an interaction relative to sqrt(h_i h_j) (1 allows any PSD pair).
        locality: width of the kernel that down-weights runs far from the incumbent.
        replicas, endgame_replicas: runs of the predicted point, far from and near the optimum.
        pairs: pair corners per wave.
        significance: interactions smaller than this many of their standard errors count as 0.
    """

    name = "surface"

    def __init__(
        self,
        dims: Sequence[Dimension],
        *,
        lower_is_better: bool = True,
        seed: int = 0,
        first_step: float = 0.3,
        step: float = 0.2,
        radius: float = 0.5,
        grow: float = 1.5,
        shrink: float = 0.5,
        max_radius: float = 2.0,
        min_radius: float = 1 / 64,
        coupling: float = 0.3,
        locality: float = 0.75,
        replicas: int = 2,
        endgame_replicas: int = 3,
        pairs: int = 10,
        significance: float = 2.0,
        effect: float = 10.0,
        max_step: float = 0.5,
    ) -> None:
        super().__init__(dims, lower_is_better=lower_is_better, seed=seed)
        if replicas < 1 or endgame_replicas < 1 or pairs < 0:
            raise UsageError(
                f"replicas `{replicas}` and endgame_replicas `{endgame_replicas}` must be at least 1, "
                f"pairs `{pairs}` at least 0"
            )
        self.first_step, self.step = first_step, step
        self.radius, self.grow, self.shrink = radius, grow, shrink
        self.max_radius, self.min_radius = max_radius, min_radius
        self.coupling, self.locality = coupling, locality
        self.replicas, self.endgame_replicas, self.pairs = replicas, endgame_replicas, pairs
        self.significance, self.effect, self.max_step = significance, effect, max_step
        self._figures: dict[tuple, list[float]] = {}
        self._configs: dict[tuple, Knobs] = {}  # key -> knobs of every incumbent seen

    def observe_incumbent(self, knobs: Mapping[str, str], values: Sequence[float]) -> None:
        key = _key(knobs, self.dims)
        self._figures[key], self._configs[key] = list(values), dict(knobs)

    def trust_radius(self, history: Sequence[Observation]) -> float:
        """The radius after the history's waves (the first wave is a stencil: no prediction to judge)."""
        r = self.radius
        for wave in sorted({o.wave for o in history})[1:]:
            runs = [o for o in history if o.wave == wave]
            predicted, n = Counter(_key(o.knobs, self.dims) for o in runs).most_common(1)[0]
            adopted = [o for o in runs if o.adopted]
            if not adopted:
                r *= self.shrink
            elif n > 1 and _key(adopted[0].knobs, self.dims) == predicted:
                r = min(r * self.grow, self.max_radius)
        return r

    def _coded(self, knobs: Mapping[str, str]) -> np.ndarray:
        return np.array([d.coded(parse_value(knobs[d.name])) for d in self.dims])

    def _knobs(self, base: Mapping[str, str], x: np.ndarray) -> Knobs:
        return {
            **base,
            **{d.name: d.to_source(d.from_coded(float(c))) for d, c in zip(self.dims, x, strict=True)},
        }

    def propose(self, incumbent: Mapping[str, str], history: Sequence[Observation], k: int) -> list[Knobs]:
        names = [d.name for d in self.dims]
        if not history:
            return stencil(self.dims, incumbent, self.first_step, names)[:k]
        r = self.trust_radius(history)
        if r < self.min_radius:
            return []
        X, y, sigma = self._data(history)
        x0 = self._coded(incumbent)
        g, H, _ = self._model(X - x0, y, sigma)
        d = _box_minimum(g, H, np.maximum(-r, -1 - x0), np.minimum(r, 1 - x0))
        gain = -(g @ d + 0.5 * d @ H @ d)
        point = self._knobs(incumbent, np.round(x0 + d, 4))  # 1e-4 of the range: no 7e-08 next to a bound
        n = min(k, self.replicas if gain > 4 * sigma else self.endgame_replicas)
        crashed = {_key(o.knobs, self.dims) for o in history if o.value is None}
        if _key(point, self.dims) in crashed | {_key(incumbent, self.dims)}:
            n = 0  # nothing better within the radius, or a known crash: measure around it instead
        # The design serves the next fit, which will be centred on the new point.
        p = self._coded(point)
        _, _, cov = self._model(X - p, y, sigma)
        s = min(self.step, r)
        # per knob, a step whose curvature shows at `effect` noise sd (weak knobs need wide steps)
        curvature = np.maximum(np.diag(H), 1e-12)
        steps = np.clip(np.sqrt(2 * self.effect * sigma / curvature), s, max(s, self.max_step))
        runs = [point] * n + self._design(point, p - x0, cov, s, steps, k - n)
        out, seen = [], {_key(incumbent, self.dims)} | crashed
        for i, run in enumerate(runs):
            key = _key(run, self.dims)
            if i < n or key not in seen:  # the predicted point's replicas are meant
                out.append(run)
                seen.add(key)
        return out[:k]

    def _data(self, history: Sequence[Observation]) -> tuple[np.ndarray, np.ndarray, float]:
        """(coded configurations, signed metric values so lower is better, the noise sd)."""
        groups = replicate_groups(history, self.dims, self._figures)
        by_key = {**self._configs, **{_key(o.knobs, self.dims): o.knobs for o in history}}
        X = np.array([self._coded(by_key[key]) for key, values in groups.items() for _ in values])
        y = (1.0 if self.lower_is_better else -1.0) * np.array([v for vs in groups.values() for v in vs])
        sigma, _ = pooled_sd(groups.values())
        return X, y, _fallback_sigma(y) if sigma is None else max(sigma, 1e-9)

    def _model(self, X: np.ndarray, y: np.ndarray, sigma: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(g, H made positive definite, covariance) of the fit on X, centred where X is 0."""
        g, H, cov = _fit(X, y, sigma=sigma, coupling=self.coupling, locality=self.locality)
        n = len(self.dims)
        sd = np.sqrt(np.maximum(np.diag(cov), 0.0))
        for m, (i, j) in enumerate(itertools.combinations(range(n), 2)):
            if abs(H[i, j]) < self.significance * sd[1 + 2 * n + m]:
                H[i, j] = H[j, i] = 0.0  # an interaction inside its noise would only bend the step
        return g, _positive_definite(H), cov

    def _design(
        self, point: Knobs, move: np.ndarray, cov: np.ndarray, s: float, steps: np.ndarray, room: int
    ) -> list[Knobs]:
        """Pair corners where an interaction could shift the prediction most (its sd times the two
        knobs' reach), then a stencil on the knobs whose change over their reach is least known
        (slope and curvature: a knob no recent run varied near the point counts as unknown)."""
        n_dims = len(self.dims)
        reach = np.abs(move) + s
        pairs = list(itertools.combinations(range(n_dims), 2))
        pair_sd = np.sqrt(np.maximum(np.diag(cov)[1 + 2 * n_dims :], 0.0))
        ranked = sorted(
            range(len(pairs)), key=lambda m: -pair_sd[m] * reach[pairs[m][0]] * reach[pairs[m][1]]
        )
        chosen = [pairs[m] for m in ranked[: self.pairs]]
        variance = np.maximum(np.diag(cov), 0.0)
        slope_sd, curvature_sd = (
            np.sqrt(variance[1 : 1 + n_dims]),
            np.sqrt(variance[1 + n_dims : 1 + 2 * n_dims]),
        )
        n_stencil = max(0, (room - len(chosen) + 1) // 2)
        unknown = slope_sd * reach + curvature_sd * reach**2 / 2  # sd of the change over the reach
        probed = sorted(range(n_dims), key=lambda i: -unknown[i])[:n_stencil]
        runs = [
            r for i in sorted(probed) for r in stencil(self.dims, point, float(steps[i]), [self.dims[i].name])
        ]
        for i, j in chosen:
            corner = dict(point)
            for a in (i, j):
                dim, here = self.dims[a], parse_value(point[self.dims[a].name])
                toward = 1 if move[a] >= 0 else -1  # further along the move, or back at an edge
                value = _step_value(dim, here, toward, float(steps[a]))
                if value == here:
                    value = _step_value(dim, here, -toward, float(steps[a]))
                corner[dim.name] = dim.to_source(value)
            runs.append(corner)
        return runs


def _fallback_sigma(y: np.ndarray) -> float:
    """A noise scale when nothing was repeated: a tenth of the metric's spread (it only sets the prior's weight)."""
    spread = float(np.std(y)) if len(y) > 1 else 0.0
    return spread / 10 if spread > 0 else 1e-9


def _features(X: np.ndarray) -> np.ndarray:
    """Columns: 1, d_i, d_i^2 / 2, then d_i d_j for i < j (the model's a, g, diag H, off-diagonal H)."""
    n = X.shape[1]
    cols = [np.ones(len(X))] + [X[:, i] for i in range(n)] + [0.5 * X[:, i] ** 2 for i in range(n)]
    cols += [X[:, i] * X[:, j] for i, j in itertools.combinations(range(n), 2)]
    return np.column_stack(cols)


def _fit(
    X: np.ndarray, y: np.ndarray, *, sigma: float, coupling: float, locality: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(g, H, posterior covariance of all coefficients) of the quadratic model."""
    n = X.shape[1]
    F = _features(X)
    w = np.exp(-np.sum(X**2, axis=1) / (2 * locality**2))
    FtW = F.T * w
    s2 = sigma**2
    # Priors as precisions times s2 (the noise variance), so a tiny sigma stays well conditioned.
    free = 1e-8  # a vanishing prior on the intercept, slopes and curvatures
    # the curvatures of a model without interactions set the interactions' prior scale
    sep = slice(0, 1 + 2 * n)
    separable = np.linalg.lstsq(FtW[sep] @ F[:, sep], FtW[sep] @ y, rcond=None)[0]
    h = np.maximum(np.abs(separable[1 + n :]), 1e-3)
    precision = np.full(F.shape[1], free)
    for m, (i, j) in enumerate(itertools.combinations(range(n), 2)):
        precision[1 + 2 * n + m] = 1 / (coupling**2 * h[i] * h[j])
    A = FtW @ F + np.diag(precision) * s2
    # a floor far below any real information: what no run measured keeps a large variance
    inverse = np.linalg.inv(A + np.eye(len(A)) * 1e-12 * float(np.mean(np.diag(A))))
    beta = inverse @ (FtW @ y)
    cov = s2 * (inverse + inverse.T) / 2
    H = np.diag(beta[1 + n : 1 + 2 * n])
    for m, (i, j) in enumerate(itertools.combinations(range(n), 2)):
        H[i, j] = H[j, i] = beta[1 + 2 * n + m]
    return beta[1 : 1 + n], H, cov


def _positive_definite(H: np.ndarray, floor: float = 0.01) -> np.ndarray:
    """H with its eigenvalues raised to at least `floor` times the largest: a bowl to minimise."""
    values, vectors = np.linalg.eigh(H)
    top = max(float(values.max()), 1e-6)
    return (vectors * np.maximum(values, floor * top)) @ vectors.T


def _box_minimum(
    g: np.ndarray, H: np.ndarray, lo: np.ndarray, hi: np.ndarray, sweeps: int = 500
) -> np.ndarray:
    """argmin g.d + 1/2 d'Hd over lo <= d <= hi (H positive definite), by projected coordinate descent."""
    d = np.clip(np.zeros_like(g), lo, hi)
    for _ in range(sweeps):
        before = d.copy()
        for i in range(len(d)):
            d[i] = min(max(d[i] - (g[i] + H[i] @ d) / H[i, i], lo[i]), hi[i])
        if np.max(np.abs(d - before)) < 1e-10:
            break
    return d
