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
    critical,
    incumbent_is_stale,
    pooled_sd,
    promote,
    repeats_needed,
    runs_without_floor,
    spearman,
    t_quantile,
    verdict,
)

INCUMBENT = [1.000, 1.002, 0.998, 1.001, 0.999]  # mean 1.000
SIGMA = 0.002  # noise floor: se with one candidate run = sqrt(0.002**2 + 0.002**2 / 5) ~ 0.00219


def test_real_gain_is_kept() -> None:
    d = verdict([0.990, 0.9902], INCUMBENT, noise_sigma=SIGMA)
    assert d.verdict == "keep"
    assert d.delta == pytest.approx(0.0099)
    assert d.se == pytest.approx(math.sqrt(SIGMA**2 / 2 + SIGMA**2 / 5))
    assert d.z_score == pytest.approx(0.0099 / d.se)
    assert d.repeats_to_settle is None
    assert d.threshold == 2.0 and d.dof is None  # an exact floor (no dof given): z itself


def test_one_run_is_never_kept_its_spread_is_unknown() -> None:
    # 4.6 standard errors on one run: the gain is clear, but one run shows nothing of its own
    # noise (which may be larger than the floor's): the repeat that would show it is the settle
    d = verdict([0.990], INCUMBENT, noise_sigma=SIGMA)
    assert d.verdict == "within-noise" and d.z_score > 4
    assert d.repeats_to_settle == Repeats(candidate=1, incumbent=0)
    assert "2 runs on each side" in d.reason
    one_incumbent = verdict([0.990, 0.9902], [1.0], noise_sigma=SIGMA)
    assert one_incumbent.verdict == "within-noise"
    assert one_incumbent.repeats_to_settle == Repeats(candidate=0, incumbent=1)


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
    assert verdict([1.010, 1.0098], INCUMBENT, noise_sigma=SIGMA, lower_is_better=False).verdict == "keep"
    assert verdict([0.990], INCUMBENT, noise_sigma=SIGMA, lower_is_better=False).verdict == "discard"


def test_z_is_configurable() -> None:
    assert verdict([0.995, 0.9952], INCUMBENT, noise_sigma=SIGMA, z=2.0).verdict == "keep"  # z 2.9
    assert verdict([0.995, 0.9952], INCUMBENT, noise_sigma=SIGMA, z=3.0).verdict == "within-noise"


def test_repeated_candidate_uses_its_spread_but_never_below_the_floor() -> None:
    lucky = [0.9975, 0.9976, 0.9975]  # agree far more closely than the noise floor allows
    assert verdict(lucky, INCUMBENT, noise_sigma=SIGMA).verdict == "within-noise"
    # Without a floor the sample spread is all there is (Welch, t with 4 dof: 2.99); here the
    # candidate's is tiny, so the gain counts: 3.5 standard errors of the incumbent's spread.
    alone = verdict(lucky, INCUMBENT, noise_sigma=None)
    assert alone.verdict == "keep" and alone.dof == 4
    assert alone.threshold == pytest.approx(critical(2.0, 4))
    noisy = [0.990, 1.000, 0.980]
    d = verdict(noisy, INCUMBENT, noise_sigma=SIGMA)
    assert d.se == pytest.approx(math.sqrt(0.01**2 / 3 + SIGMA**2 / 5))


def test_no_noise_estimate_is_conservative() -> None:
    d = verdict([0.900], [1.0], noise_sigma=None)
    assert d.verdict == "within-noise"
    assert "nightlab noise" in d.reason
    assert d.se is None and d.repeats_to_settle is None
    assert verdict([1.1], [1.0], noise_sigma=None).verdict == "discard"


def test_without_a_floor_the_runs_a_gain_needs_are_named() -> None:
    assert runs_without_floor(1, 1) == Repeats(candidate=1, incumbent=2)
    assert runs_without_floor(2, 4) == Repeats(candidate=0, incumbent=0)


def test_cross_tier_comparison_refused() -> None:
    with pytest.raises(UsageError, match="`h100` with tier `h200`"):
        verdict([0.99], INCUMBENT, noise_sigma=SIGMA, candidate_tier="h100", incumbent_tier="h200")
    same = verdict([0.99, 0.99], INCUMBENT, noise_sigma=SIGMA, candidate_tier="h100", incumbent_tier="h100")
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
    # 0.9961 (two runs) is 2.33 standard errors better: a keep on its own, within noise as the best
    # of the three measured candidates (z 2.43; e4 has no run and does not count).
    alone = best_of_wave({"e1": [0.9960, 0.9962]}, INCUMBENT, noise_sigma=SIGMA)
    assert alone[0] == "e1" and alone[1].verdict == "keep"
    four = {"e1": [0.9960, 0.9962], "e2": [1.001], "e3": [0.999], "e4": []}
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
        # none is really better; two runs each (a keep needs them), judged on the exact floor
        candidates = {f"e{i}": [rng.gauss(0, 1), rng.gauss(0, 1)] for i in range(8)}
        best = min(candidates, key=lambda i: sum(candidates[i]))
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


# --- the floor is an estimate: its degrees of freedom and each side's own spread count (issue 17)


def test_t_quantile_matches_scipy() -> None:
    from scipy.special import stdtrit

    for dof in (1, 2, 3, 4, 7, 10, 51, 999, 1001, 20000):
        for p in (0.5, 0.8, 0.975, 0.99856, 0.99999):
            assert t_quantile(p, dof) == pytest.approx(float(stdtrit(dof, p)), rel=1e-6, abs=1e-9)
    with pytest.raises(UsageError, match="dof >= 1"):
        t_quantile(0.9, 0)


def test_critical_is_the_t_quantile_at_the_level_of_z() -> None:
    assert critical(2.0, None) == 2.0 and critical(2.0, math.inf) == 2.0
    assert critical(2.0, 2) == pytest.approx(4.53, abs=0.01)
    assert critical(2.0, 20) == pytest.approx(2.13, abs=0.01)
    sidak16 = adjusted_z(2.0, 16)
    assert critical(sidak16, 2) == pytest.approx(18.6, abs=0.1)
    assert critical(sidak16, 5) == pytest.approx(5.43, abs=0.01)
    # Welch dof are rounded down: never more lenient than the integer below
    assert critical(2.0, 4.9) == critical(2.0, 4)


def test_traced_h14_floor_of_three_repeats_no_longer_keeps_a_lucky_run() -> None:
    """bench/search_family.py h14 seed 210, pattern, first wave (the issue-17 trace): the floor from
    3 repeats of the start (2 dof) read sd 0.113 where the true sd was 0.192; a run 2.3 true sd
    lucky, best of 13 candidates, read 3.9 sd and the old rule (z as if the floor were exact,
    2.90 after Sidak) kept it: a wrong keep. Now the threshold is t with 2 dof (15.7), and one run
    is not enough to keep anyway; two agreeing runs still are not (the floor's dof decide)."""
    start = [0.0, 0.113, 0.226]  # sd 0.113, mean 0.113
    sigma, dof = pooled_sd([start])
    assert (round(sigma, 3), dof) == (0.113, 2)
    lucky = 0.113 - 3.9 * sigma * math.sqrt(1 + 1 / 3)
    others = {f"e{i}": [0.113 + 0.05 * i] for i in range(1, 13)}
    best, d = best_of_wave({"e0": [lucky], **others}, start, noise_sigma=sigma, noise_dof=dof)
    assert best == "e0" and d.z_score == pytest.approx(3.9)
    assert d.z_score > adjusted_z(2.0, 13)  # what the old rule compared it with: a keep
    assert d.verdict == "within-noise" and d.dof == 2 and d.threshold > 15
    _, twice = best_of_wave({"e0": [lucky, lucky + 0.01], **others}, start, noise_sigma=sigma, noise_dof=dof)
    assert twice.verdict == "within-noise"


def test_traced_h15_single_runs_on_a_floor_from_quieter_configurations_are_not_kept() -> None:
    """h15 seed 216, surface, wave 5: noise grows with LR, and the pooled floor (0.0123, 6 dof) came
    from lower-LR configurations; true sd 0.031 at the incumbent (one run) and 0.039 at the winner
    (one run, best of 15). The old rule read 5.1 sd (> 2.94 after Sidak) and kept a worse point."""
    floor, dof = 0.0123, 6
    others = {f"e{i}": [1.40 + 0.01 * i] for i in range(1, 15)}
    best, d = best_of_wave({"e0": [1.2931], **others}, [1.3826], noise_sigma=floor, noise_dof=dof)
    assert best == "e0" and d.z_score == pytest.approx(5.1, abs=0.1)
    assert d.z_score > adjusted_z(2.0, 15) and d.z_score > d.threshold  # clears even the t threshold
    assert d.verdict == "within-noise"  # but one run on each side shows no spread of its own
    assert d.repeats_to_settle == Repeats(candidate=1, incumbent=1)


def test_a_side_that_scatters_more_than_the_floor_is_judged_on_its_own_spread() -> None:
    """Heteroscedastic noise: two runs 2.1x the floor's sd apart (variance ratio 4.5, beyond the
    95 % chi-square quantile 3.84) are not judged on the floor. The old rule (max of the two sd's,
    z as if exact) read 3.48 sd and kept it; on its own spread it has 1 dof, threshold 14."""
    incumbent = [1.0, 1.01, 0.99, 1.0]
    noisy = [0.93, 0.96]
    d = verdict(noisy, incumbent, noise_sigma=0.01, noise_dof=50)
    assert d.z_score == pytest.approx(3.48, abs=0.01)
    assert d.verdict == "within-noise" and d.dof == 1 and d.threshold > 13
    # the same gain on runs that agree as the floor says is kept
    calm = verdict([0.945, 0.945], incumbent, noise_sigma=0.01, noise_dof=50)
    assert calm.verdict == "keep" and calm.dof == 50


def test_the_t_rule_holds_the_false_keep_rate_with_a_floor_of_few_repeats() -> None:
    """Null waves of 8 candidates (2 runs each) on a floor estimated from 3 repeats of the start:
    with z as if the floor were exact, far more than 2.3 % of waves keep; with the t quantile at most
    about that."""
    rng = random.Random(1)
    waves, exact, t_rule = 3000, 0, 0
    for _ in range(waves):
        start = [rng.gauss(0, 1) for _ in range(3)]
        candidates = {f"e{i}": [rng.gauss(0, 1), rng.gauss(0, 1)] for i in range(8)}
        sigma, dof = pooled_sd([start, *candidates.values()][:1])
        exact += best_of_wave(candidates, start, noise_sigma=sigma)[1].verdict == "keep"
        t_rule += best_of_wave(candidates, start, noise_sigma=sigma, noise_dof=dof)[1].verdict == "keep"
    single = 1 - NormalDist().cdf(2.0)
    assert exact / waves > 2 * single
    assert t_rule / waves < 1.5 * single


def test_best_of_wave_adopts_the_best_kept_candidate_not_a_lucky_single_run() -> None:
    """After a settle round the repeated candidate is kept (two runs) while a rival with one lucky
    run has the better mean; the wave's pick is the kept one (each is tested at the wave's Sidak z,
    so any keep is sound), not the rival, whose one run cannot be kept."""
    settled, rival = [0.990, 0.9905], [0.9895]
    best, d = best_of_wave({"e1": settled, "e2": rival}, INCUMBENT, noise_sigma=SIGMA)
    assert (best, d.verdict) == ("e1", "keep")
    best, d = best_of_wave({"e2": rival}, INCUMBENT, noise_sigma=SIGMA)
    assert (best, d.verdict) == ("e2", "within-noise") and d.repeats_to_settle == Repeats(1, 0)
