"""Verdicts: is a candidate better than the incumbent by more than the noise?

The rule (docs/search.md has the derivation):

    gain  = mean(incumbent) - mean(candidate)        (sign flipped when higher is better)
    se    = sqrt(sigma_c**2 / n_c + sigma_i**2 / n_i)
    keep          when gain >  z * se
    within-noise  when 0 < gain <= z * se
    discard       when gain <= 0

sigma of a side with one run is the lab's noise floor (`noise_sigma`, from `nightlab noise`);
with two or more runs it is their sample standard deviation, but never below the noise floor:
two or three lucky seeds often agree more closely than the metric really does ("lucky-seed
gaming" in autoresearch forks), and the floor is measured from many repeats. With no noise
floor and a single run on either side nothing can be decided: the verdict is `within-noise`
and the reason names `nightlab noise`.

Figures are only ever compared within one tier: the same code scores differently on an H100
and an H200 under a wall-clock budget, so a cross-tier comparison is refused.

Picking the best of a wave and testing it is a multiple comparison: with 8 candidates that are
all as good as the incumbent (one run each, four incumbent runs), the best one clears z = 2 in
13 % of waves (20k simulated waves through `verdict`), not the 2.3 % of a single comparison.
`best_of_wave` therefore raises z with the Sidak correction for the number of candidates, which
brings the same simulation down to 1.8 %.

Promotion between tiers (screen on a cheap tier, confirm on the validation tier) uses
`promote` to pick the candidates and `spearman` to report how well the screen's ranking
transferred.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from nightlab.errors import UsageError

__all__ = [
    "Decision",
    "pooled_sd",
    "adjusted_z",
    "best_of_wave",
    "Figure",
    "Repeats",
    "incumbent_is_stale",
    "promote",
    "repeats_needed",
    "spearman",
    "verdict",
]

KEEP, WITHIN_NOISE, DISCARD = "keep", "within-noise", "discard"
# Beyond this many extra runs per side, settling a gain costs more than the gain is worth.
_MAX_REPEATS = 64


@dataclass(frozen=True)
class Figure:
    """Summary of the runs of one snapshot on one tier."""

    mean: float
    std: float | None  # sample standard deviation; None with a single run
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Figure:
        """The figure of a non-empty list of metric values."""
        if not values:
            raise UsageError("no finished runs to summarise; wait for the runs or submit repeats")
        std = statistics.stdev(values) if len(values) > 1 else None
        return cls(statistics.fmean(values), std, len(values))


@dataclass(frozen=True)
class Repeats:
    """Extra runs that would settle a within-noise gain if the mean gain held."""

    candidate: int
    incumbent: int


@dataclass(frozen=True)
class Decision:
    """A verdict with its numbers.

    Attributes:
        verdict: `keep`, `within-noise` or `discard`.
        delta: the gain (positive = candidate better), in metric units.
        se: standard error of the difference (None when there is no noise estimate).
        z_score: delta / se (None without se; inf when se is 0 and delta > 0).
        repeats_to_settle: for `within-noise`, the extra runs that would make the gain
            significant if it held; None when it is out of reach or there is no noise estimate.
        reason: one line for people.
    """

    verdict: str
    delta: float
    se: float | None
    z_score: float | None
    repeats_to_settle: Repeats | None
    reason: str


def _sigma(fig: Figure, noise_sigma: float | None) -> float | None:
    if fig.std is None:
        return noise_sigma
    return fig.std if noise_sigma is None else max(fig.std, noise_sigma)


def pooled_sd(groups: Iterable[Sequence[float]]) -> tuple[float | None, int]:
    """The pooled sd of the groups of repeated runs (groups of one run add nothing), and its
    degrees of freedom; (None, 0) when no group has two runs."""
    ss, dof = 0.0, 0
    for values in groups:
        if len(values) > 1:
            mean = sum(values) / len(values)
            ss += sum((v - mean) ** 2 for v in values)
            dof += len(values) - 1
    return (math.sqrt(ss / dof), dof) if dof else (None, 0)


def repeats_needed(
    gain: float, *, sigma_c: float, sigma_i: float, n_c: int, n_i: int, z: float = 2.0
) -> Repeats | None:
    """The fewest extra runs after which `gain` would exceed `z` standard errors.

    Candidate runs are added first; when the incumbent's own uncertainty alone is too large,
    both sides get runs up to the same count.

    Returns:
        The extra runs per side, or None when the gain is not positive or would need more than
        64 extra runs per side.
    """
    if gain <= 0:
        return None

    def significant(nc: int, ni: int) -> bool:
        return gain > z * math.sqrt(sigma_c**2 / nc + sigma_i**2 / ni)

    for extra in range(_MAX_REPEATS + 1):
        if significant(n_c + extra, n_i):
            return Repeats(candidate=extra, incumbent=0)
    for n in range(max(n_c, n_i), max(n_c, n_i) + _MAX_REPEATS + 1):
        if significant(max(n, n_c), max(n, n_i)):
            return Repeats(candidate=max(n - n_c, 0), incumbent=max(n - n_i, 0))
    return None


def verdict(
    candidate: Sequence[float],
    incumbent: Sequence[float],
    *,
    noise_sigma: float | None,
    z: float = 2.0,
    lower_is_better: bool = True,
    candidate_tier: str | None = None,
    incumbent_tier: str | None = None,
) -> Decision:
    """Decide keep / within-noise / discard for a candidate against the incumbent.

    Args:
        candidate: the candidate's metric values (finished, valid runs) on one tier.
        incumbent: the incumbent's metric values on the same tier.
        noise_sigma: the tier's noise floor (standard deviation of one run), or None if unmeasured.
        z: how many standard errors the gain must exceed.
        lower_is_better: the metric's direction.
        candidate_tier: the candidate's tier, checked against `incumbent_tier` when both are given.
        incumbent_tier: the incumbent's tier.

    Raises:
        UsageError: the tiers differ, a side has no runs, or z / noise_sigma is negative.
    """
    if candidate_tier is not None and incumbent_tier is not None and candidate_tier != incumbent_tier:
        raise UsageError(
            f"cannot compare tier `{candidate_tier}` with tier `{incumbent_tier}`: results are only "
            f"compared within a tier; measure the incumbent on `{candidate_tier}`"
        )
    if z < 0 or (noise_sigma is not None and noise_sigma < 0):
        raise UsageError(f"z `{z}` and noise sigma `{noise_sigma}` must not be negative")
    if not incumbent:
        raise UsageError("the incumbent has no finished run on this tier; run it first (nightlab submit)")
    cand, inc = Figure.of(candidate), Figure.of(incumbent)
    delta = inc.mean - cand.mean if lower_is_better else cand.mean - inc.mean
    sigma_c, sigma_i = _sigma(cand, noise_sigma), _sigma(inc, noise_sigma)
    if sigma_c is None or sigma_i is None:
        if delta <= 0:
            return Decision(DISCARD, delta, None, None, None, "no better than the incumbent")
        return Decision(
            WITHIN_NOISE,
            delta,
            None,
            None,
            None,
            "single run and no noise floor; measure it with `nightlab noise`",
        )
    se = math.sqrt(sigma_c**2 / cand.n + sigma_i**2 / inc.n)
    z_score = delta / se if se > 0 else (math.inf if delta > 0 else -math.inf if delta < 0 else 0.0)
    if delta <= 0:
        return Decision(DISCARD, delta, se, z_score, None, "no better than the incumbent")
    if delta > z * se:
        return Decision(KEEP, delta, se, z_score, None, f"gain is {z_score:.1f} standard errors (> {z:g})")
    repeats = repeats_needed(delta, sigma_c=sigma_c, sigma_i=sigma_i, n_c=cand.n, n_i=inc.n, z=z)
    return Decision(
        WITHIN_NOISE, delta, se, z_score, repeats, f"gain is {z_score:.1f} standard errors (<= {z:g})"
    )


def incumbent_is_stale(measured_wave: int | None, current_wave: int, *, max_age_waves: int) -> bool:
    """Whether the incumbent's figure must be re-measured before judging the current wave.

    Args:
        measured_wave: index of the wave in which the incumbent was last run (None: never).
        current_wave: index of the wave being judged.
        max_age_waves: `[search] incumbent_max_age_waves`.
    """
    return measured_wave is None or current_wave - measured_wave > max_age_waves


def promote(means: Mapping[str, float], k: int, *, lower_is_better: bool = True) -> list[str]:
    """The ids of the `k` best candidates by mean on the screening tier, best first.

    Pass only candidates that beat the incumbent on the screen (verdict keep or within-noise):
    promoting a loser spends validation runs on it.
    """
    if k < 1:
        raise UsageError(f"promote top k needs k >= 1, got `{k}`; set [search] promote_top_k")
    return sorted(means, key=lambda i: means[i] if lower_is_better else -means[i])[:k]


def spearman(screen: Mapping[str, float], validation: Mapping[str, float]) -> float | None:
    """Rank correlation between two tiers over the candidates measured on both.

    Returns:
        Spearman's rho in [-1, 1], or None with fewer than 3 common candidates or a constant side
        (the rank correlation is undefined).
    """
    from scipy.stats import spearmanr

    common = [i for i in screen if i in validation]
    if len(common) < 3:
        return None
    a, b = [screen[i] for i in common], [validation[i] for i in common]
    if len(set(a)) == 1 or len(set(b)) == 1:
        return None
    return float(spearmanr(a, b).statistic)


def adjusted_z(z: float, comparisons: int) -> float:
    """The z that keeps the family-wise false-keep rate of `comparisons` tests at that of one test at z.

    Sidak: alpha = P(N(0,1) > z), alpha_m = 1 - (1 - alpha)**(1/m), z_m = the quantile of 1 - alpha_m.
    For z = 2: 2.0 for one candidate, 2.53 for 4, 2.76 for 8.
    """
    from statistics import NormalDist

    if comparisons <= 1:
        return z
    unit = NormalDist()
    alpha = 1.0 - unit.cdf(z)
    alpha_m = 1.0 - (1.0 - alpha) ** (1.0 / comparisons)
    return unit.inv_cdf(1.0 - alpha_m)


def best_of_wave(
    candidates: Mapping[str, Sequence[float]],
    incumbent: Sequence[float],
    *,
    noise_sigma: float | None,
    z: float = 2.0,
    lower_is_better: bool = True,
) -> tuple[str, Decision] | None:
    """The wave's best candidate by mean and its verdict, with z corrected for the wave's size.

    Args:
        candidates: candidate id -> its metric values on the tier (candidates without a
            finished run are left out by the caller).
        incumbent: the incumbent's metric values on the same tier.

    Returns:
        (id, decision) of the best candidate, or None when no candidate has a value.
    """
    measured = {i: v for i, v in candidates.items() if v}
    if not measured:
        return None
    ranked = promote(
        {i: statistics.fmean(v) for i, v in measured.items()}, 1, lower_is_better=lower_is_better
    )
    best = ranked[0]
    decision = verdict(
        measured[best],
        incumbent,
        noise_sigma=noise_sigma,
        z=adjusted_z(z, len(measured)),
        lower_is_better=lower_is_better,
    )
    return best, decision
