"""Tests for nightlab.search.decide: the keep / within-noise / discard rule, repeats, promotion.

Run: .venv/bin/python -m pytest -q tests/search/test_decide.py
"""

from __future__ import annotations

import math
import random
from statistics import NormalDist

import pytest

from nightlab.errors import UsageError
from nightlab.search.decide import (
    Figure,
    Repeats,
    adjusted_z,
    best_of_wave,
    incumbent_is_stale,
    pooled_sd,
    promote,
    repeats_needed,
    spearman,
    verdict,
)

INCUMBENT = [1.000, 1.002, 0.998, 1.001, 0.999]  # mean 1.000
SIGMA = 0.002  # noise floor: se with one candidate run = sqrt(0.002**2 + 0.002**2 / 5) ~ 0.00219


def test_real_gain_is_kept() -> None:
    d = verdict([0.990], INCUMBENT, noise_sigma=SIGMA)
    assert d.verdict == "keep"
    assert d.delta == pytest.approx(0.010)
    assert d.se == pytest.approx(math.sqrt(SIGMA**2 + SIGMA**2 / 5))
    assert d.z_score == pytest.approx(0.010 / d.se)
    assert d.repeats_to_settle is None


def test_small_gain_is_within_noise_with_repeats_to_settle() -> None:
    d = verdict([0.997], INCUMBENT, noise_sigma=SIGMA)
    assert d.verdict == "within-noise"
    assert 0 < d.z_score <= 2
    repeats = d.repeats_to_settle
    assert repeats is not None
    # With those extra runs the same gain would clear 2 standard errors, and with one fewer it would not.
    n_c, n_i = 1 + repeats.candidate, 5 + repeats.incumbent
    assert 2 * math.sqrt(SIGMA**2 / n_c + SIGMA**2 / n_i) < 0.003
    if repeats.incumbent == 0:
        assert 2 * math.sqrt(SIGMA**2 / (n_c - 1) + SIGMA**2 / n_i) >= 0.003


def test_worse_or_equal_is_discarded() -> None:
    assert verdict([1.010], INCUMBENT, noise_sigma=SIGMA).verdict == "discard"
    assert verdict([1.000], INCUMBENT, noise_sigma=SIGMA).verdict == "discard"


def test_higher_is_better_flips_the_sign() -> None:
    assert verdict([1.010], INCUMBENT, noise_sigma=SIGMA, lower_is_better=False).verdict == "keep"
    assert verdict([0.990], INCUMBENT, noise_sigma=SIGMA, lower_is_better=False).verdict == "discard"


def test_z_is_configurable() -> None:
    assert verdict([0.995], INCUMBENT, noise_sigma=SIGMA, z=2.0).verdict == "keep"
    assert verdict([0.995], INCUMBENT, noise_sigma=SIGMA, z=3.0).verdict == "within-noise"


def test_repeated_candidate_uses_its_spread_but_never_below_the_floor() -> None:
    lucky = [0.9980, 0.9981, 0.9980]  # agree far more closely than the noise floor allows
    assert verdict(lucky, INCUMBENT, noise_sigma=SIGMA).verdict == "within-noise"
    # Without a floor the sample spread is all there is; here it is tiny, so the gain counts.
    assert verdict(lucky, INCUMBENT, noise_sigma=None).verdict == "keep"
    noisy = [0.990, 1.000, 0.980]
    d = verdict(noisy, INCUMBENT, noise_sigma=SIGMA)
    assert d.se == pytest.approx(math.sqrt(0.01**2 / 3 + SIGMA**2 / 5))


def test_no_noise_estimate_is_conservative() -> None:
    d = verdict([0.900], [1.0], noise_sigma=None)
    assert d.verdict == "within-noise"
    assert "nightlab noise" in d.reason
    assert d.se is None and d.repeats_to_settle is None
    assert verdict([1.1], [1.0], noise_sigma=None).verdict == "discard"


def test_cross_tier_comparison_refused() -> None:
    with pytest.raises(UsageError, match="`h100` with tier `h200`"):
        verdict([0.99], INCUMBENT, noise_sigma=SIGMA, candidate_tier="h100", incumbent_tier="h200")
    same = verdict([0.99], INCUMBENT, noise_sigma=SIGMA, candidate_tier="h100", incumbent_tier="h100")
    assert same.verdict == "keep"


def test_missing_runs_and_bad_parameters() -> None:
    with pytest.raises(UsageError, match="incumbent has no finished run"):
        verdict([0.99], [], noise_sigma=SIGMA)
    with pytest.raises(UsageError, match="no finished runs"):
        verdict([], INCUMBENT, noise_sigma=SIGMA)
    with pytest.raises(UsageError, match="negative"):
        verdict([0.99], INCUMBENT, noise_sigma=-1.0)


def test_figure() -> None:
    assert Figure.of([1.0]) == Figure(1.0, None, 1)
    fig = Figure.of([1.0, 3.0])
    assert (fig.mean, fig.n) == (2.0, 2) and fig.std == pytest.approx(math.sqrt(2))


def test_repeats_needed() -> None:
    assert repeats_needed(0.0, sigma_c=1, sigma_i=1, n_c=1, n_i=1) is None
    # gain 1, sigma 1 each side: 1 > 2*sqrt(1/nc + 1/ni) first holds at nc = ni = 9 (2*sqrt(2/9) = 0.943).
    assert repeats_needed(1.0, sigma_c=1, sigma_i=1, n_c=1, n_i=1) == Repeats(candidate=8, incumbent=8)
    # The incumbent is already well measured: candidate runs alone settle it (1/nc + 1/100 < 1/4 at nc = 5).
    assert repeats_needed(1.0, sigma_c=1, sigma_i=1, n_c=1, n_i=100) == Repeats(candidate=4, incumbent=0)
    assert repeats_needed(1e-6, sigma_c=1, sigma_i=1, n_c=1, n_i=1) is None  # out of reach


def test_incumbent_is_stale() -> None:
    assert incumbent_is_stale(None, 0, max_age_waves=3)
    assert not incumbent_is_stale(2, 5, max_age_waves=3)
    assert incumbent_is_stale(1, 5, max_age_waves=3)


def test_promote_and_spearman() -> None:
    screen = {"e1": 0.99, "e2": 0.97, "e3": 0.98, "e4": 1.01}
    assert promote(screen, 2) == ["e2", "e3"]
    assert promote(screen, 2, lower_is_better=False) == ["e4", "e1"]
    with pytest.raises(UsageError, match="k >= 1"):
        promote(screen, 0)
    validation = {"e2": 0.95, "e3": 0.96, "e1": 0.97, "e9": 0.5}
    assert spearman(screen, validation) == pytest.approx(1.0)
    assert spearman(screen, {"e2": 0.97, "e3": 0.96, "e1": 0.95}) == pytest.approx(-1.0)
    assert spearman(screen, {"e2": 0.95, "e3": 0.96}) is None
    assert spearman(screen, {"e1": 1.0, "e2": 1.0, "e3": 1.0}) is None


def test_adjusted_z_keeps_the_family_error_of_one_test() -> None:
    assert adjusted_z(2.0, 1) == 2.0
    single = 1 - NormalDist().cdf(2.0)
    for m in (2, 8, 50):
        z_m = adjusted_z(2.0, m)
        assert z_m > 2.0
        assert 1 - (1 - (1 - NormalDist().cdf(z_m))) ** m == pytest.approx(single)


def test_best_of_wave_picks_the_best_mean_and_corrects_z() -> None:
    # 0.9955 is 2.05 standard errors better: a keep on its own, within noise as the best of the
    # three measured candidates (e4 has no run and does not count).
    alone = best_of_wave({"e1": [0.9955]}, INCUMBENT, noise_sigma=SIGMA)
    assert alone[0] == "e1" and alone[1].verdict == "keep"
    four = {"e1": [0.9955], "e2": [1.001], "e3": [0.999], "e4": []}
    best, decision = best_of_wave(four, INCUMBENT, noise_sigma=SIGMA)
    assert best == "e1" and decision.verdict == "within-noise"
    assert (
        best_of_wave({"e1": [1.2], "e2": [0.9]}, INCUMBENT, noise_sigma=SIGMA, lower_is_better=False)[0]
        == "e1"
    )
    assert best_of_wave({"e1": []}, INCUMBENT, noise_sigma=SIGMA) is None


def test_best_of_wave_holds_the_false_keep_rate_on_null_waves() -> None:
    rng = random.Random(0)
    waves, raw, corrected = 3000, 0, 0
    for _ in range(waves):
        incumbent = [rng.gauss(0, 1) for _ in range(4)]
        candidates = {f"e{i}": [rng.gauss(0, 1)] for i in range(8)}  # none is really better
        best = min(candidates, key=lambda i: candidates[i][0])
        raw += verdict(candidates[best], incumbent, noise_sigma=1.0).verdict == "keep"
        corrected += best_of_wave(candidates, incumbent, noise_sigma=1.0)[1].verdict == "keep"
    single = 1 - NormalDist().cdf(2.0)  # 2.3 %: one comparison at z = 2
    assert raw / waves > 4 * single
    assert corrected / waves < 1.5 * single


def test_pooled_sd_weighs_groups_by_their_degrees_of_freedom() -> None:
    # (1, 3): ss 2, 1 dof; (2, 4, 6): ss 8, 2 dof; a single run adds nothing
    sd, dof = pooled_sd([[1.0, 3.0], [2.0, 4.0, 6.0], [9.0]])
    assert dof == 3 and sd == pytest.approx((10 / 3) ** 0.5)
    assert pooled_sd([[1.0], [2.0]]) == (None, 0)
