"""Percentiles (SPEC §2 linear interpolation), summaries and confidence intervals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from app.analysis.percentiles import (
    BOOTSTRAP_MAX_N,
    BOOTSTRAP_RESAMPLES,
    PERCENTILES,
    Distribution,
    percentile,
    percentile_key,
    percentiles,
    summarize,
    weighted_cdf_percentiles,
    weighted_mean_std,
)


def test_spec_worked_example_a_percentiles() -> None:
    assert percentile([100, 150, 180], 50) == 150
    assert percentile([100, 150, 180], 95) == pytest.approx(177, abs=1e-12)
    assert percentile([220, 150, 380], 50) == 220
    assert percentile([220, 150, 380], 95) == pytest.approx(364, abs=1e-12)
    assert percentile([40, 100], 50) == pytest.approx(70)
    assert percentile([40, 100], 95) == pytest.approx(97, abs=1e-12)
    assert percentile([40, 40, 40, 100, 100], 50) == 40
    assert percentile([40, 40, 40, 100, 100], 95) == 100


def test_interpolation_formula_edge_cases() -> None:
    assert percentile([7.0], 0) == 7.0
    assert percentile([7.0], 50) == 7.0
    assert percentile([7.0], 100) == 7.0
    assert percentile([1.0, 2.0], 0) == 1.0
    assert percentile([1.0, 2.0], 100) == 2.0
    assert percentile([1.0, 2.0], 25) == pytest.approx(1.25)
    # unsorted input, ties
    assert percentile([3, 1, 2, 2], 50) == 2.0
    # position (N-1)*p lands exactly on an element: no interpolation
    assert percentile([10, 20, 30, 40, 50], 75) == 40.0


def test_no_samples_is_none_not_zero() -> None:
    assert percentile([], 50) is None
    assert percentile([np.nan, np.nan], 99) is None
    assert percentiles([], (50, 99)) == {50.0: None, 99.0: None}
    d = summarize([])
    assert d.count == 0 and not d.has_data
    assert d.mean is None and d.min is None and d.max is None and d.std is None
    assert all(v is None for v in d.percentiles.values())
    assert all(v is None for v in d.ci95.values())
    assert d.reason == "no samples"
    json.dumps(d.to_dict())


def test_nan_samples_are_skipped() -> None:
    assert percentile([np.nan, 1.0, 3.0, np.nan], 50) == 2.0
    assert summarize([np.nan, 5.0]).count == 1


def test_invalid_percentile_raises() -> None:
    with pytest.raises(ValueError):
        percentile([1.0], 101)
    with pytest.raises(ValueError):
        percentile([1.0], -1)


@pytest.mark.parametrize("n", [1, 2, 3, 10, 1001, BOOTSTRAP_MAX_N + 7, 100_003])
def test_matches_numpy_linear(n: int) -> None:
    rng = np.random.default_rng(n)
    x = rng.lognormal(3.0, 1.0, n)
    ps = (0.0, 1.0, 33.3, *PERCENTILES)
    got = percentiles(x, ps)
    want = np.percentile(x, ps)
    assert [got[float(p)] for p in ps] == pytest.approx(want, rel=1e-12)
    d = summarize(x, ci=False)
    assert d.count == n
    assert d.mean == pytest.approx(x.mean(), rel=1e-12)
    assert d.std == pytest.approx(x.std(), rel=1e-9)
    assert d.min == x.min() and d.max == x.max()
    for p in PERCENTILES:
        assert d.percentiles[p] == pytest.approx(np.percentile(x, p), rel=1e-12)


def test_integer_samples_large_path() -> None:
    rng = np.random.default_rng(1)
    x = rng.integers(0, 10_000_000, 50_000).astype(np.int64)
    d = summarize(x)
    assert d.ci_method == "order-statistic"
    for p in PERCENTILES:
        assert d.percentiles[p] == pytest.approx(np.percentile(x, p), rel=1e-12)
    assert d.std == pytest.approx(x.std(), rel=1e-9)


def test_summarize_does_not_mutate_input_unless_owned() -> None:
    x = np.array([5.0, 1.0, 3.0])
    summarize(x)
    assert list(x) == [5.0, 1.0, 3.0]
    big = np.arange(BOOTSTRAP_MAX_N * 2, 0, -1, dtype=np.int64)
    before = big.copy()
    summarize(big)
    assert np.array_equal(big, before)


def test_exclude_positions_equals_filtered_copy() -> None:
    rng = np.random.default_rng(2)
    for n in (500, 60_000):
        x = rng.integers(-(10**10), 10**9, n).astype(np.int64)
        exclude = np.unique(rng.integers(0, n, n // 10))
        keep = np.ones(n, np.bool_)
        keep[exclude] = False
        want = summarize(x[keep], seed=3)
        got = summarize(x.copy(), owned=True, exclude=exclude, seed=3)
        assert got.count == want.count
        assert got.mean == pytest.approx(want.mean, rel=1e-12)
        assert got.std == pytest.approx(want.std, rel=1e-9)
        assert got.min == want.min and got.max == want.max
        assert got.percentiles == want.percentiles
        assert got.ci95 == want.ci95


def test_exclude_everything_is_no_data() -> None:
    x = np.array([1, 2, 3], np.int64)
    assert summarize(x, owned=True, exclude=np.array([0, 1, 2])).count == 0


def test_exclude_requires_owned_int_array() -> None:
    with pytest.raises(ValueError):
        summarize(np.array([1.0, 2.0]), owned=True, exclude=np.array([0]))
    with pytest.raises(ValueError):
        summarize(np.array([1, 2], np.int64), exclude=np.array([0]))


def _widths(d: Distribution) -> dict[float, float]:
    out = {}
    for p, ci in d.ci95.items():
        assert ci is not None
        out[p] = ci[1] - ci[0]
    return out


def test_ci_contains_estimate_and_is_seeded() -> None:
    rng = np.random.default_rng(4)
    for n in (1, 2, 5, 50, 2_000, BOOTSTRAP_MAX_N + 1, 200_000):
        x = rng.exponential(10.0, n)
        d = summarize(x, seed=11)
        assert d.ci_method == ("bootstrap" if n <= BOOTSTRAP_MAX_N else "order-statistic")
        for p in PERCENTILES:
            lo_hi = d.ci95[p]
            est = d.percentiles[p]
            assert lo_hi is not None and est is not None
            assert lo_hi[0] <= est <= lo_hi[1]
        assert summarize(x, seed=11).ci95 == d.ci95
    assert summarize([1.0, 2.0], ci=False).ci95 == {p: None for p in PERCENTILES}


def test_ci_narrows_with_n() -> None:
    rng = np.random.default_rng(5)
    small = _widths(summarize(rng.exponential(10.0, 200)))
    mid = _widths(summarize(rng.exponential(10.0, 20_000)))
    large = _widths(summarize(rng.exponential(10.0, 2_000_000)))
    for p in (50.0, 90.0, 95.0, 99.0):
        assert mid[p] < small[p]
        assert large[p] < mid[p]


def test_bootstrap_agrees_with_brute_force_resampling() -> None:
    # The Gamma-spacing shortcut draws the resamples' order statistics exactly; compare its
    # interval with a literal resample-with-replacement bootstrap.
    rng = np.random.default_rng(6)
    x = rng.lognormal(0.0, 0.7, 60)
    d = summarize(x, seed=1)
    boot = rng.choice(x, size=(20_000, x.size), replace=True)
    for p in (50.0, 90.0):
        vals = np.percentile(boot, p, axis=1)
        want = np.percentile(vals, [2.5, 97.5])
        got = d.ci95[p]
        assert got is not None
        spread = want[1] - want[0]
        assert got[0] == pytest.approx(want[0], abs=0.1 * spread)
        assert got[1] == pytest.approx(want[1], abs=0.1 * spread)
    assert BOOTSTRAP_RESAMPLES >= 1000


def test_order_statistic_ci_coverage_is_about_95_percent() -> None:
    rng = np.random.default_rng(7)
    hits = 0
    trials = 200
    true_median = np.log(2.0)  # Exp(1)
    for _ in range(trials):
        d = summarize(rng.exponential(1.0, BOOTSTRAP_MAX_N + 1000), ps=(50.0,))
        ci = d.ci95[50.0]
        assert ci is not None
        hits += ci[0] <= true_median <= ci[1]
    assert 0.88 <= hits / trials <= 0.995


def test_divided_and_to_dict_keys() -> None:
    d = summarize(np.array([1e6, 2e6, 3e6])).divided(1e6)
    assert d.percentiles[50.0] == 2.0 and d.max == 3.0 and d.mean == 2.0
    out = d.to_dict()
    for key in ("count", "mean", "std", "min", "max", "p50", "p90", "p95", "p99", "p99_9"):
        assert key in out
    ci = out["ci95"]
    assert isinstance(ci, dict) and set(ci) == {"p50", "p90", "p95", "p99", "p99_9", "max"}
    json.dumps(out)
    assert percentile_key(99.9) == "p99_9" and percentile_key(100) == "max"


def test_weighted_cdf_no_interpolation() -> None:
    # values 10 (w 1), 20 (w 1): CDF 0.5 at 10 -> p50 is 10, not 15
    got = weighted_cdf_percentiles([20.0, 10.0], [1.0, 1.0], (50.0, 51.0, 100.0))
    assert got == {50.0: 10.0, 51.0: 20.0, 100.0: 20.0}
    # weights move the median: 10 (w 1), 20 (w 3): CDF 0.25, 1.0
    assert weighted_cdf_percentiles([10.0, 20.0], [1.0, 3.0], (50.0,)) == {50.0: 20.0}
    assert weighted_cdf_percentiles([], [], (50.0,)) == {50.0: None}
    mean, std = weighted_mean_std([10.0, 20.0], [1.0, 3.0])
    assert mean == pytest.approx(17.5)
    assert std == pytest.approx(np.sqrt((7.5**2 * 1 + 2.5**2 * 3) / 4))
    assert weighted_mean_std([], []) == (None, None)


def _guidellm_rule(values: list[float], weights: list[float], q: float) -> float:
    """GuideLLM 0.8.1's published rule (``DistributionSummary.from_values`` then
    ``Percentiles.from_pdf``), written again in plain Python: merge equal values by summing
    their weights, drop zero weights, divide each weight by the total *before* summing, and
    take the first value whose running sum of probabilities reaches q (searchsorted left)."""
    merged: dict[float, float] = {}
    for v, w in sorted(zip(values, weights, strict=True)):
        merged[v] = merged.get(v, 0.0) + w
    items = [(v, w) for v, w in sorted(merged.items()) if w > 0]
    total = sum(w for _, w in items)
    running = 0.0
    for v, w in items:
        running += w / total
        if running >= q:
            return v
    return items[-1][0]


@pytest.mark.parametrize(
    ("values", "q", "p", "hand"),
    [
        # ten equal weights: 0.1 summed nine times is 0.8999999999999999 < 0.9, so p90 is the
        # tenth value (a running sum of raw weights, 9 >= 0.9 x 10, would say the ninth)
        ([float(v) for v in range(1, 11)], 0.9, 90.0, 10.0),
        # twelve: six twelfths sum to 0.49999999999999994 < 0.5: p50 is the seventh
        ([float(v) for v in range(1, 13)], 0.5, 50.0, 7.0),
        # ties merged first: 2/12 + 2/12 + 1/12 + 1/12 falls short of 0.5 -> 6, not 5
        ([2.0, 2, 3, 3, 4, 5, 6, 7, 9, 9, 9, 9], 0.5, 50.0, 6.0),
        # the ties' merged weights reach 0.5 at 3 (unmerged twelfths would not: 5)
        ([1.0, 2, 2, 3, 3, 3, 5, 6, 6, 7, 8, 8], 0.5, 50.0, 3.0),
        # 0.2 + 0.4 + 0.1 + 0.1 + 0.1 reaches 0.9 at 7 (unmerged tenths: 9)
        ([1.0, 1, 3, 3, 3, 3, 4, 5, 7, 9], 0.9, 90.0, 7.0),
    ],
)
def test_weighted_cdf_ties_as_guidellm_081(
    values: list[float], q: float, p: float, hand: float
) -> None:
    """Issue 24.5: GuideLLM normalises the weights before summing them and merges ties;
    the values above are what GuideLLM 0.8.1 itself prints for them."""
    ones = [1.0] * len(values)
    assert _guidellm_rule(values, ones, q) == hand
    shuffled = values[::-1]  # order of the input does not matter
    assert weighted_cdf_percentiles(shuffled, ones, (p,)) == {p: hand}


def test_weighted_cdf_weights_and_p999_as_guidellm() -> None:
    # weights 3, 1, 2, 4 (total 10) on values 40, 10, 30, 20 -> sorted 10 (0.1), 20 (0.4),
    # 30 (0.2), 40 (0.3): running 0.1, 0.5, 0.7, 1.0 -> p50 20, p90 40; p99.9 asks for 0.999
    # (GuideLLM's literal), not 99.9 / 100 = 0.9990000000000001
    v, w = [40.0, 10.0, 30.0, 20.0], [3.0, 1.0, 2.0, 4.0]
    got = weighted_cdf_percentiles(v, w, (50.0, 70.0, 90.0, 99.9, 100.0))
    assert got == {50.0: 20.0, 70.0: 30.0, 90.0: 40.0, 99.9: 40.0, 100.0: 40.0}
    for p in (50.0, 70.0, 90.0, 99.9):
        assert got[p] == _guidellm_rule(v, w, round(p / 100, 12))
    # 0 .. 999, equal weights: 999 thousandths sum to 0.9990000000000008 >= 0.999, so p99.9
    # is 998 (GuideLLM 0.8.1 prints 998); 99.9 / 100 would have asked for more: 999
    thousand = [float(i) for i in range(1000)]
    ones = [1.0] * 1000
    assert _guidellm_rule(thousand, ones, 0.999) == 998.0
    assert weighted_cdf_percentiles(thousand, ones, (99.9,))[99.9] == 998.0
    # the mean from the merged probabilities: 10 x 0.1 + 20 x 0.4 + 30 x 0.2 + 40 x 0.3 = 27
    mean, std = weighted_mean_std(v, w)
    assert mean == pytest.approx(27.0)
    assert std == pytest.approx(np.sqrt(0.1 * 17**2 + 0.4 * 7**2 + 0.2 * 3**2 + 0.3 * 13**2))
