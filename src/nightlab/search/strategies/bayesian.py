"""The `optuna` strategy: Optuna's TPE or GP sampler through ask-and-tell (the Optuna adapter).

Optuna is imported inside the functions that use it, so choosing another strategy never loads it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from nightlab.errors import UsageError
from nightlab.search.knobs import parse_value
from nightlab.search.spaces import Choice, Dimension, IntRange, LogUniform, Pow2, Uniform
from nightlab.search.strategies._base import BaseStrategy, Knobs, Observation, _choice_position, _key

__all__ = ["OptunaStrategy"]


def _distribution(dim: Dimension) -> Any:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if isinstance(dim, Choice):
        return CategoricalDistribution(list(dim.sources))
    if isinstance(dim, Pow2):  # searched on the exponent
        return IntDistribution(int(math.log2(dim.lo)), int(math.log2(dim.hi)))
    if isinstance(dim, IntRange):
        return IntDistribution(int(dim.lo), int(dim.hi))
    if isinstance(dim, (Uniform, LogUniform)):
        return FloatDistribution(float(dim.lo), float(dim.hi), log=isinstance(dim, LogUniform))
    raise TypeError(f"no Optuna distribution for {type(dim).__name__}")


def _param_to_source(dim: Dimension, param: Any) -> str:
    if isinstance(dim, Choice):
        return str(param)
    if isinstance(dim, Pow2):
        return f"2**{int(param)}"
    if isinstance(dim, IntRange):
        return str(int(param))
    return dim.to_source(float(param))


def _source_to_param(dim: Dimension, source: str) -> Any | None:
    """The Optuna parameter of a knob value, or None when it lies outside the space."""
    value = parse_value(source)
    if isinstance(dim, Choice):
        i = _choice_position(dim, value)
        return None if i is None else dim.sources[i]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not dim.lo <= value <= dim.hi:  # type: ignore[attr-defined]
        return None
    if isinstance(dim, Pow2):
        exponent = math.log2(value)
        return int(exponent) if exponent.is_integer() else None
    if isinstance(dim, IntRange):
        return int(value) if float(value).is_integer() else None
    return float(value)


class OptunaStrategy(BaseStrategy):
    """Bayesian optimisation through Optuna's ask-and-tell interface.

    Args:
        sampler: `tpe` (TPESampler, multivariate, constant liar: trials in flight count as
            already measured at a pessimistic value, so a batch spreads out) or `gp` (GPSampler,
            which conditions on running trials itself).
        n_startup_trials: random trials before the model takes over.
    """

    name = "optuna"

    def __init__(
        self,
        dims: Sequence[Dimension],
        *,
        lower_is_better: bool = True,
        seed: int = 0,
        sampler: str = "tpe",
        n_startup_trials: int = 8,
    ) -> None:
        super().__init__(dims, lower_is_better=lower_is_better, seed=seed)
        if sampler not in ("tpe", "gp"):
            raise UsageError(f"unknown sampler `{sampler}`; use tpe or gp")
        self.sampler = sampler
        self.n_startup_trials = n_startup_trials
        self._study: Any = None
        self._pending: dict[tuple, Any] = {}
        self._told: set[str] = set()

    @property
    def study(self) -> Any:
        """The in-memory Optuna study (created on first use)."""
        if self._study is None:
            import optuna

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            if self.sampler == "tpe":
                sampler = optuna.samplers.TPESampler(
                    seed=self.seed,
                    multivariate=True,
                    constant_liar=True,
                    n_startup_trials=self.n_startup_trials,
                )
            else:
                sampler = optuna.samplers.GPSampler(seed=self.seed, n_startup_trials=self.n_startup_trials)
            direction = "minimize" if self.lower_is_better else "maximize"
            self._study = optuna.create_study(sampler=sampler, direction=direction)
        return self._study

    def tell(self, observations: Sequence[Observation]) -> None:
        """Tell finished runs: pending trials are completed, unknown ones (a resume) added."""
        from optuna.trial import TrialState, create_trial

        distributions = {d.name: _distribution(d) for d in self.dims}
        for obs in observations:
            if obs.id in self._told:
                continue
            self._told.add(obs.id)
            key = _key(obs.knobs, self.dims)
            state = TrialState.COMPLETE if obs.value is not None else TrialState.FAIL
            if key in self._pending:
                trial = self._pending.pop(key)
                self.study.tell(trial, obs.value if obs.value is not None else None, state=state)
                continue
            params = {d.name: _source_to_param(d, obs.knobs.get(d.name, "None")) for d in self.dims}
            if any(p is None for p in params.values()):
                continue  # measured outside the space (e.g. the starting incumbent): nothing to learn
            self.study.add_trial(
                create_trial(params=params, distributions=distributions, value=obs.value, state=state)
            )

    def propose(self, incumbent: Mapping[str, str], history: Sequence[Observation], k: int) -> list[Knobs]:
        from optuna.trial import TrialState

        self.tell(history)
        distributions = {d.name: _distribution(d) for d in self.dims}
        out: list[Knobs] = []
        # A small space runs out of new points: give up after 20 duplicate draws per wanted trial.
        for _ in range(20 * k):
            if len(out) == k:
                break
            trial = self.study.ask(distributions)
            knobs = {d.name: _param_to_source(d, trial.params[d.name]) for d in self.dims}
            key = _key(knobs, self.dims)
            if key in self._pending:
                self.study.tell(trial, state=TrialState.FAIL)  # a duplicate: drop it from the study
                continue
            self._pending[key] = trial
            out.append(knobs)
        return out
