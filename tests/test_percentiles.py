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
