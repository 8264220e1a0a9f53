"""Effects of a wave's factors: main effects and two-way interactions by least squares.

The model, on coded levels x in [-1, +1]:

    y = b0 + sum_i b_i x_i + sum_{i<j} b_ij x_i x_j + noise

fitted by ordinary least squares (statsmodels OLS), with standard errors and p-values from the
residuals. On two-level designs the classic "effect" (mean at high minus mean at low) is
2 * b_i. Terms the design cannot separate (aliased in a fraction, or columns that are constant
or copies of earlier ones) are dropped before the fit and listed in `EffectsResult.dropped`;
when the runs leave no residual degree of freedom the interactions are dropped so standard
errors exist, and if even the main effects saturate the design the coefficients are reported
without standard errors.

The predicted best combination is the best fitted value over the grid of the coded levels that
occur in the runs (the corners for a two-level design).

Crashed and still-running runs carry no metric: the caller passes the finished runs and the
counts; the result then says how many runs are missing, and an all-crashed wave gives a result
with a message and no numbers.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Effect", "EffectsResult", "estimate_effects", "plot_main_effects"]

# Evaluating the model on every grid point stops being cheap beyond this many points.
_MAX_GRID = 1 << 16


@dataclass(frozen=True)
class Effect:
    """One fitted term: a factor (`DEPTH`) or a two-way interaction (`DEPTH:MATRIX_LR`)."""

    term: str
    coefficient: float
    std_error: float | None
    p_value: float | None

    @property
    def effect(self) -> float:
        """High minus low on a two-level factor: twice the coefficient."""
        return 2.0 * self.coefficient


@dataclass(frozen=True)
class EffectsResult:
    """What `estimate_effects` found. `message` is set when something limits the numbers."""

    factors: tuple[str, ...]
    n_runs: int
    intercept: float | None = None
    terms: tuple[Effect, ...] = ()
    dropped: tuple[str, ...] = ()
    residual_dof: int = 0
    r_squared: float | None = None
    predicted_best: dict[str, float] = field(default_factory=dict)
    predicted_metric: float | None = None
    crashed: int = 0
    pending: int = 0
    message: str | None = None

    @property
    def main_effects(self) -> tuple[Effect, ...]:
        return tuple(t for t in self.terms if ":" not in t.term)

    @property
    def interactions(self) -> tuple[Effect, ...]:
        return tuple(t for t in self.terms if ":" in t.term)

    def coefficient(self, term: str) -> float:
        """The coefficient of a term, 0.0 for a dropped or unknown one."""
        return next((t.coefficient for t in self.terms if t.term == term), 0.0)


def _missing(crashed: int, pending: int) -> str:
    parts = []
    if pending:
        parts.append(f"{pending} still running (partial result)")
    if crashed:
        parts.append(f"{crashed} crashed")
    return "; ".join(parts)


def estimate_effects(
    rows: Sequence[Mapping[str, float]],
    y: Sequence[float],
    factors: Sequence[str],
    *,
    interactions: bool = True,
    lower_is_better: bool = True,
    crashed: int = 0,
    pending: int = 0,
) -> EffectsResult:
    """Fit main effects (and two-way interactions) of coded factor levels to a metric.

    Args:
        rows: coded level of every factor, one mapping per finished run.
        y: the metric of each of those runs.
        factors: the factor names, in report order.
        interactions: whether to fit two-way interactions.
        lower_is_better: the metric's direction, for the predicted best combination.
        crashed: runs of the wave that crashed (reported, not fitted).
        pending: runs of the wave still queued or running (reported, not fitted).

    Returns:
        The estimates; when no fit is possible, a result whose `message` says why and which has
        no numbers.
    """
    import numpy as np
    import statsmodels.api as sm

    factors = tuple(factors)
    n = len(y)
    if len(rows) != n:
        raise ValueError(f"{len(rows)} rows but {n} metric values")
    missing = _missing(crashed, pending)
    base = {"factors": factors, "n_runs": n, "crashed": crashed, "pending": pending}
    if n == 0:
        if pending and not crashed:
            why = f"no run has finished yet; {pending} still running"
        elif pending:
            why = f"no run has finished with a metric: {missing}"
        elif crashed:
            why = f"all {crashed} runs crashed; no effects to estimate"
        else:
            why = "the wave has no runs"
        return EffectsResult(**base, message=why)
    if not factors:
        return EffectsResult(**base, message="the wave has no factors")

    labels = list(factors)
    columns = [[float(r[f]) for r in rows] for f in factors]
    if interactions:
        for a, b in itertools.combinations(range(len(factors)), 2):
            labels.append(f"{factors[a]}:{factors[b]}")
            columns.append([x * w for x, w in zip(columns[a], columns[b], strict=True)])

    # Keep a term only if it adds a direction the intercept and earlier terms do not span:
    # aliased and constant columns cannot be estimated.
    X = np.ones((n, 1))
    kept: list[str] = []
    dropped: list[str] = []
    for label, col in zip(labels, columns, strict=True):
        trial = np.column_stack([X, col])
        if np.linalg.matrix_rank(trial) > X.shape[1]:
            X, kept = trial, [*kept, label]
        else:
            dropped.append(label)
    if n - X.shape[1] < 1 and any(":" in k for k in kept):
        # No residual left: trade the interactions for standard errors on the main effects.
        mains = [i for i, k in enumerate(kept) if ":" not in k]
        dropped += [k for k in kept if ":" in k]
        X = X[:, [0] + [i + 1 for i in mains]]
        kept = [kept[i] for i in mains]

    fit = sm.OLS(np.asarray(y, dtype=float), X).fit()
    dof = int(round(fit.df_resid))
    params = [float(p) for p in fit.params]
    if dof >= 1:
        ses: list[float | None] = [float(s) for s in fit.bse]
        ps: list[float | None] = [float(p) for p in fit.pvalues]
    else:
        ses, ps = [None] * len(params), [None] * len(params)
    terms = tuple(Effect(label, params[i + 1], ses[i + 1], ps[i + 1]) for i, label in enumerate(kept))
    notes = [m for m in (missing,) if m]
    if dropped:
        notes.append(f"not estimable (aliased or constant): {', '.join(dropped)}")
    if dof < 1:
        notes.append("no residual degrees of freedom: no standard errors; add runs or repeats")
    best, predicted = _predict_best(rows, factors, params, kept, lower_is_better)
    return EffectsResult(
        **base,
        intercept=params[0],
        terms=terms,
        dropped=tuple(dropped),
        residual_dof=max(dof, 0),
        r_squared=float(fit.rsquared) if n > X.shape[1] and math.isfinite(fit.rsquared) else None,
        predicted_best=best,
        predicted_metric=predicted,
        message="; ".join(notes) or None,
    )


def _predict_best(
    rows: Sequence[Mapping[str, float]],
    factors: tuple[str, ...],
    params: list[float],
    kept: list[str],
    lower_is_better: bool,
) -> tuple[dict[str, float], float | None]:
    """The best fitted value over the grid of coded levels seen in the runs."""
    levels = [sorted({float(r[f]) for r in rows}) for f in factors]
    size = math.prod(len(v) for v in levels)
    if size > _MAX_GRID:
        # Too many points: judge only the runs' own combinations.
        grid: Sequence[Sequence[float]] = [[float(r[f]) for f in factors] for r in rows]
    else:
        grid = list(itertools.product(*levels))
    index = {f: i for i, f in enumerate(factors)}
    best_point: Sequence[float] | None = None
    best_value: float | None = None
    for point in grid:
        value = params[0]
        for coef, label in zip(params[1:], kept, strict=True):
            x = 1.0
            for f in label.split(":"):
                x *= point[index[f]]
            value += coef * x
        if best_value is None or (value < best_value if lower_is_better else value > best_value):
            best_point, best_value = point, value
    assert best_point is not None
    return {f: float(x) for f, x in zip(factors, best_point, strict=True)}, best_value


def plot_main_effects(result: EffectsResult, path: str | Path, *, metric: str = "metric") -> Path:
    """Save the main-effects plot: predicted metric at each factor's low and high level.

    One panel per factor on a shared y axis, with error bars of two standard errors of the
    coefficient; steep lines are the factors that matter.

    Raises:
        ValueError: the result has no estimated main effects (check `result.message`).
    """
    # A bare Figure renders with the Agg canvas and touches no pyplot global state.
    from matplotlib.figure import Figure

    mains = result.main_effects
    if result.intercept is None or not mains:
        raise ValueError(result.message or "no main effects were estimated")
    fig = Figure(figsize=(2.2 * len(mains) + 1.0, 3.0))
    axes = fig.subplots(1, len(mains), sharey=True, squeeze=False)
    for ax, eff in zip(axes[0], mains, strict=True):
        lows_highs = [result.intercept - eff.coefficient, result.intercept + eff.coefficient]
        err = None if eff.std_error is None else [2 * eff.std_error] * 2
        ax.errorbar([-1, 1], lows_highs, yerr=err, marker="o", capsize=3)
        ax.set_title(eff.term, fontsize=9)
        ax.set_xticks([-1, 1], ["low", "high"])
        ax.axhline(result.intercept, color="0.8", lw=0.8, zorder=0)
    axes[0][0].set_ylabel(metric)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    return out
