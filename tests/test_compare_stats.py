"""Comparison statistics: Mann-Whitney U against hand-computed values, the bootstrap of a
percentile against a brute-force bootstrap, and the verdicts on known distributions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats  # a dev dependency: the reference for the rank test

from app.analysis.compare import (
    CompareOptions,
    bootstrap_percentiles,
    combine_verdicts,
    compare_error_rates,
    compare_samples,
    mann_whitney_u,
    rank_average,
    two_proportion_test,
)


def test_average_ranks_share_ties() -> None:
    ranks, ties = rank_average(np.array([10.0, 20.0, 20.0, 5.0, 20.0]))
    assert ranks.tolist() == [2.0, 4.0, 4.0, 1.0, 4.0]
    assert sorted(ties.tolist()) == [1, 1, 3]


def test_mann_whitney_separated_samples() -> None:
    # U = 0; mu = 12.5; sigma^2 = 25 * 11 / 12; z = (0 - 12.5 + 0.5) / sigma
    r = mann_whitney_u([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    sigma = math.sqrt(25 * 11 / 12)
    assert r.u == 0.0
    assert r.z == pytest.approx(-12.0 / sigma)
    assert r.p_value == pytest.approx(math.erfc(12.0 / sigma / math.sqrt(2)))
    assert r.p_value == pytest.approx(0.012186, abs=1e-6)  # scipy asymptotic: 0.01218578
    assert mann_whitney_u([6, 7, 8, 9, 10], [1, 2, 3, 4, 5]).u == 25.0


def test_mann_whitney_tie_correction_by_hand() -> None:
    # x = [1,2,2,3], y = [2,3,4,4,5]: U_x = 0 + .5 + .5 + 1.5 = 2.5
    # tie groups (2: 3 values, 3: 2, 4: 2): sum(t^3 - t) = 24 + 6 + 6 = 36, n = 9
    # sigma^2 = 20/12 * (10 - 36/72) = 15.8333; z = (2.5 - 10 + 0.5) / sigma
    r = mann_whitney_u([1, 2, 2, 3], [2, 3, 4, 4, 5])
    assert r.u == 2.5
    sigma = math.sqrt(20 / 12 * (10 - 36 / 72))
    assert r.z == pytest.approx(-7.0 / sigma)
    assert r.p_value == pytest.approx(0.078546, abs=1e-5)
    no_cc = mann_whitney_u([1, 2, 2, 3], [2, 3, 4, 4, 5], continuity=False)
    assert no_cc.z == pytest.approx(-7.5 / sigma)


def test_mann_whitney_degenerate_and_bad_input() -> None:
    same = mann_whitney_u([3.0, 3.0, 3.0], [3.0, 3.0])
    assert same.p_value == 1.0 and same.u == 3.0
    with pytest.raises(ValueError, match="at least one sample"):
        mann_whitney_u([], [1.0])
    with pytest.raises(ValueError, match="finite"):
        mann_whitney_u([1.0, math.nan], [1.0])


def test_mann_whitney_p_is_uniform_under_the_null() -> None:
    rng = np.random.default_rng(7)
    ps = np.array(
        [mann_whitney_u(rng.normal(size=60), rng.normal(size=80)).p_value for _ in range(400)]
    )
    assert 0.02 <= float(np.mean(ps < 0.05)) <= 0.09
    assert 0.4 <= float(np.median(ps)) <= 0.6


def test_two_proportion_test_by_hand() -> None:
    # 10/100 vs 25/100: pooled .175, se = sqrt(.175 * .825 * .02) = .053735; z = 2.7914
    p = two_proportion_test(10, 100, 25, 100)
    assert p == pytest.approx(math.erfc(0.15 / math.sqrt(0.175 * 0.825 * 0.02) / math.sqrt(2)))
    assert p == pytest.approx(0.00525, abs=5e-5)
    assert two_proportion_test(0, 10, 0, 10) == 1.0
    assert two_proportion_test(0, 0, 1, 10) is None


def test_bootstrap_percentiles_match_brute_force() -> None:
    rng = np.random.default_rng(3)
    x = np.sort(rng.lognormal(0, 0.7, 101))
    fast = bootstrap_percentiles(x, (50.0, 90.0, 99.0), 20_000, np.random.default_rng(1))
    idx = np.random.default_rng(2).integers(0, x.size, (20_000, x.size))
    slow = np.percentile(x[idx], [50, 90, 99], axis=1).T
    for j in range(3):
        assert fast[:, j].mean() == pytest.approx(slow[:, j].mean(), rel=0.025)
        assert fast[:, j].std() == pytest.approx(slow[:, j].std(), rel=0.06)
        lo_f, hi_f = np.percentile(fast[:, j], [2.5, 97.5])
        lo_s, hi_s = np.percentile(slow[:, j], [2.5, 97.5])
        assert lo_f == pytest.approx(lo_s, rel=0.05) and hi_f == pytest.approx(hi_s, rel=0.05)
    one = bootstrap_percentiles(np.array([4.0]), (50.0, 99.0), 100, np.random.default_rng(0))
    assert np.all(one == 4.0)


def _latencies(rng: np.random.Generator, n: int, scale: float = 1.0) -> np.ndarray:
    return scale * rng.lognormal(math.log(100.0), 0.35, n)


def test_same_distribution_gives_no_change_in_95_percent_of_trials() -> None:
    trials, no_change = 200, 0
    for seed in range(trials):
        rng = np.random.default_rng(1000 + seed)
        r = compare_samples(
            "ttft_ms", _latencies(rng, 300), _latencies(rng, 300), CompareOptions(seed=seed)
        )
        no_change += r.verdict == "no significant change"
    assert no_change / trials >= 0.95, no_change


def test_ten_percent_median_shift_is_detected() -> None:
    trials, regressed, improved = 40, 0, 0
    for seed in range(trials):
        rng = np.random.default_rng(5000 + seed)
        base = _latencies(rng, 1000)
        slower = compare_samples(
            "ttft_ms", base, _latencies(rng, 1000, 1.10), CompareOptions(seed=seed)
        )
        p50 = slower.percentiles[0]
        regressed += p50.verdict == "regressed" and slower.verdict == "regressed"
        faster = compare_samples(
            "ttft_ms", base, _latencies(rng, 1000, 1 / 1.10), CompareOptions(seed=seed)
        )
        improved += faster.percentiles[0].verdict == "improved"
    assert regressed / trials >= 0.9, regressed
    assert improved / trials >= 0.9, improved


def test_significant_but_small_change_is_under_the_threshold() -> None:
    rng = np.random.default_rng(11)
    base, cand = _latencies(rng, 20_000), _latencies(rng, 20_000, 1.02)
    r = compare_samples("e2el_ms", base, cand)
    assert r.rank_test is not None and r.rank_test.p_value < 1e-6  # real, but only 2%
    assert r.verdict == "no significant change"
    r1 = compare_samples("e2el_ms", base, cand, CompareOptions(threshold=0.01))
    assert r1.percentiles[0].verdict == "regressed"
    p50 = r.percentiles[0]
    assert p50.ci_low is not None and p50.ci_high is not None and p50.delta is not None
    assert p50.ci_low < p50.delta < p50.ci_high and p50.ci_low > 0


def test_tail_regression_is_judged_by_its_interval() -> None:
    rng = np.random.default_rng(12)
    base = _latencies(rng, 3000)
    cand = _latencies(rng, 3000)
    cand[rng.random(3000) < 0.04] *= 3.0  # a slow 4%: the median barely moves, p99 does
    r = compare_samples("ttft_ms", base, cand)
    by_p = {p.p: p for p in r.percentiles}
    assert by_p[50.0].verdict == "no significant change"
    assert by_p[99.0].verdict == "regressed" and r.verdict == "regressed"


def test_no_samples_and_options() -> None:
    r = compare_samples("tpot_ms", [math.nan], [1.0, 2.0])
    assert r.verdict == "no data" and r.notes == ["no baseline samples"]
    assert all(p.baseline is None for p in r.percentiles)
    with pytest.raises(ValueError, match="alpha"):
        CompareOptions(alpha=0)
    with pytest.raises(ValueError, match="threshold"):
        CompareOptions(threshold=-0.1)
    zero = compare_samples("x", [0.0] * 30, [1.0] * 30)
    assert zero.percentiles[0].rel_delta is None
    assert zero.percentiles[0].verdict == "no significant change"


def test_error_rate_comparison_and_combining() -> None:
    worse = compare_error_rates(2, 500, 60, 500)
    assert worse.verdict == "regressed" and worse.p_value is not None and worse.p_value < 1e-6
    same = compare_error_rates(10, 500, 12, 500)
    assert same.verdict == "no significant change"
    assert compare_error_rates(0, 0, 1, 10).verdict == "no data"
    assert combine_verdicts(["improved", "no significant change"]) == "improved"
    assert combine_verdicts(["improved", "regressed"]) == "regressed"
    assert combine_verdicts(["no data", "no data"]) == "no data"
    assert combine_verdicts(["no data", "no significant change"]) == "no significant change"


@pytest.mark.parametrize("seed", range(6))
def test_mann_whitney_agrees_with_scipy(seed: int) -> None:
    """U and the two-sided p-value equal scipy's asymptotic test (tie and continuity
    corrections), on samples with many ties and of unequal sizes."""
    rng = np.random.default_rng(seed)
    x = np.round(rng.gamma(2.0, 10.0, size=40 + 7 * seed))  # rounded: ties within and across
    y = np.round(rng.gamma(2.0, 10.0 + seed, size=55)) + (seed % 2)
    for continuity in (True, False):
        ours = mann_whitney_u(x, y, continuity=continuity)
        ref = stats.mannwhitneyu(
            x, y, use_continuity=continuity, alternative="two-sided", method="asymptotic"
        )
        assert ours.u == pytest.approx(float(ref.statistic), abs=1e-9)
        assert ours.p_value == pytest.approx(float(ref.pvalue), rel=1e-9, abs=1e-12)
