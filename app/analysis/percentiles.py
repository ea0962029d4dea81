"""Percentiles by linear interpolation, summaries, and 95% confidence intervals.

SPEC §2: position ``(N-1)*p`` (p in [0, 1]), value ``x[lo] + (x[hi]-x[lo])*(pos-lo)`` on the
sorted samples (numpy's default "linear" method). No samples gives a ``Distribution`` whose
values are ``None`` ("no data"), never 0 and never an exception.

Confidence intervals (95%) for every reported percentile:

* ``N <= BOOTSTRAP_MAX_N``: percentile bootstrap, ``BOOTSTRAP_RESAMPLES`` resamples, seeded.
  The resamples are not materialised: the k-th smallest of N indices drawn uniformly with
  replacement is ``floor(N * U_(k))`` where ``U_(k)`` is a uniform order statistic, and
  the needed order statistics are drawn jointly from Gamma spacings
  (``U_(k) = S_k / S_(N+1)``, ``S`` partial sums of Exp(1)). This has exactly the
  distribution of the resample's order statistics, at O(resamples x percentiles) cost.
* larger N: the distribution-free order-statistic (binomial) interval for a quantile q:
  order statistics ``N q -/+ 1.96 sqrt(N q (1-q))`` (normal approximation of the binomial),
  asymptotically equivalent to the bootstrap and found with ``np.partition`` (no full sort).

Either interval is widened, where needed, to contain the point estimate. The maximum
(p100) has no informative interval: order-statistic gives (max, max).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

PERCENTILES: tuple[float, ...] = (50.0, 90.0, 95.0, 99.0, 99.9, 100.0)
BOOTSTRAP_MAX_N = 20_000
BOOTSTRAP_RESAMPLES = 1_000
CI_LEVEL = 0.95
_Z95 = 1.959963984540054

CIMethod = Literal["bootstrap", "order-statistic"]


def percentile_key(p: float) -> str:
    """JSON key of a percentile: 50 -> "p50", 99.9 -> "p99_9", 100 -> "max"."""
    if p == 100:
        return "max"
    text = f"{p:g}".replace(".", "_")
    return f"p{text}"


def _check_ps(ps: Sequence[float]) -> F64:
    arr = np.asarray(ps, np.float64)
    if arr.ndim != 1 or not np.all((arr >= 0) & (arr <= 100)):
        raise ValueError(f"percentiles must be in [0, 100], got {list(ps)}")
    return arr


def _positions(n: int, ps: F64) -> tuple[I64, I64, F64]:
    """0-based (lo, hi, frac) of the linear-interpolation position ``(n-1)*p/100``.

    ``frac`` is computed as ``((n-1)*p - lo*100) / 100`` so that e.g. n=3, p=95 gives 0.9
    exactly rather than 1.9 - 1.
    """
    scaled = (n - 1) * ps
    lo = np.minimum(np.floor(scaled / 100.0), n - 1).astype(np.int64)
    hi = np.minimum(lo + 1, n - 1)
    frac = np.clip((scaled - lo * 100.0) / 100.0, 0.0, 1.0)
    return lo, hi, frac


def _interp(ordered: Samples, lo: I64, hi: I64, frac: F64) -> F64:
    """``x[lo] + (x[hi]-x[lo])*frac`` where ``ordered`` has order statistics at lo and hi."""
    a = ordered[lo].astype(np.float64)
    b = ordered[hi].astype(np.float64)
    out: F64 = np.where(hi == lo, a, a + (b - a) * frac)
    return out


Samples = npt.NDArray[np.float64] | npt.NDArray[np.int64]


def _as_samples(values: npt.ArrayLike) -> Samples:
    """int64 arrays stay integer (ns; faster to partition), anything else becomes float64."""
    arr = np.asarray(values)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64, copy=False).ravel()
    return arr.astype(np.float64, copy=False).ravel()


def finite(values: npt.ArrayLike) -> Samples:
    """The finite values of ``values`` (NaN marks "undefined"); integer input is kept as is."""
    arr = _as_samples(values)
    if arr.dtype.kind == "i":
        return arr
    mask = np.isfinite(arr)
    if mask.all():
        return arr
    out: Samples = arr[mask]
    return out


def percentiles(
    values: npt.ArrayLike, ps: Sequence[float] = PERCENTILES
) -> dict[float, float | None]:
    """Linear-interpolation percentiles of the finite values; ``None`` each when empty."""
    pa = _check_ps(ps)
    x = finite(values)
    if x.size == 0:
        return {float(p): None for p in pa}
    lo, hi, frac = _positions(x.size, pa)
    part = x.copy()
    part.partition(np.unique(np.concatenate([lo, hi])))
    vals = _interp(part, lo, hi, frac)
    return {float(p): float(v) for p, v in zip(pa, vals, strict=True)}


def percentile(values: npt.ArrayLike, p: float) -> float | None:
    """One linear-interpolation percentile (p in [0, 100]); ``None`` when there are no samples."""
    return percentiles(values, (p,))[float(p)]


@dataclass(frozen=True, slots=True)
class Distribution:
    """Summary of a sample: count, mean, std (population), min, max, percentiles, 95% CIs.

    ``count == 0`` means "no data": every value is ``None`` and ``reason`` says why.
    """

    count: int
    mean: float | None = None
    std: float | None = None
    min: float | None = None
    max: float | None = None
    percentiles: Mapping[float, float | None] = field(default_factory=dict)
    ci95: Mapping[float, tuple[float, float] | None] = field(default_factory=dict)
    ci_method: CIMethod | None = None
    reason: str | None = None

    @classmethod
    def no_data(cls, reason: str = "no samples", ps: Sequence[float] = PERCENTILES) -> Distribution:
        keys = [float(p) for p in ps]
        return cls(
            count=0,
            percentiles=dict.fromkeys(keys),
            ci95=dict.fromkeys(keys),
            reason=reason,
        )

    @property
    def has_data(self) -> bool:
        return self.count > 0

    def divided(self, divisor: float) -> Distribution:
        """The same distribution in another unit (e.g. ns -> ms with ``divisor=1e6``)."""

        def d(v: float | None) -> float | None:
            return None if v is None else v / divisor

        def dci(v: tuple[float, float] | None) -> tuple[float, float] | None:
            return None if v is None else (v[0] / divisor, v[1] / divisor)

        return Distribution(
            count=self.count,
            mean=d(self.mean),
            std=d(self.std),
            min=d(self.min),
            max=d(self.max),
            percentiles={p: d(v) for p, v in self.percentiles.items()},
            ci95={p: dci(v) for p, v in self.ci95.items()},
            ci_method=self.ci_method,
            reason=self.reason,
        )

    def to_dict(self) -> dict[str, object]:
        """JSON-friendly: ``{"count", "mean", "std", "min", "max", "p50", ..., "ci95": {...}}``."""
        out: dict[str, object] = {
            "count": self.count,
            "mean": self.mean,
            "std": self.std,
            "min": self.min,
        }
        for p, v in self.percentiles.items():
            out[percentile_key(p)] = v
        out["max"] = self.max
        out["ci95"] = {
            percentile_key(p): (None if v is None else [v[0], v[1]]) for p, v in self.ci95.items()
        }
        out["ci_level"] = CI_LEVEL
        out["ci_method"] = self.ci_method
        if self.reason is not None:
            out["reason"] = self.reason
        return out


def summarize(
    values: npt.ArrayLike,
    *,
    ps: Sequence[float] = PERCENTILES,
    ci: bool = True,
    seed: int = 0,
    empty_reason: str = "no samples",
    owned: bool = False,
    exclude: I64 | None = None,
) -> Distribution:
    """Summarise the finite values of ``values`` (NaN = undefined sample, skipped).

    ``owned=True`` lets the function reorder and overwrite ``values`` in place (a temporary
    array of the caller's), avoiding copies of a large pooled sample. ``exclude`` (only with
    ``owned=True`` and an int64 array) lists positions that are not samples; they are
    skipped without building a filtered copy.
    """
    pa = _check_ps(ps)
    if exclude is not None and exclude.size:
        if not (owned and isinstance(values, np.ndarray) and values.dtype == np.int64):
            raise ValueError("exclude needs owned=True and an int64 numpy array")
        return _summarize_excluding(values.ravel(), exclude, pa, ci, seed, empty_reason)
    arr = _as_samples(values)
    x = finite(arr)
    n = int(x.size)
    if n == 0:
        return Distribution.no_data(empty_reason, [float(p) for p in pa])
    if not owned and np.may_share_memory(x, arr):
        x = x.copy()
    if n <= BOOTSTRAP_MAX_N:
        return _summarize_small(x, pa, float(x.mean()), float(x.std()), ci, seed)
    mean, std = _mean_std(x)
    return _summarize_large(x, pa, mean, std, ci, n)


_BLOCK = 1 << 20
_SENTINEL = np.iinfo(np.int64).max


def _mean_std(x: Samples, n_fill: int = 0, fill: float = 0.0) -> tuple[float, float]:
    """Mean and population std of ``x`` without a full-size temporary (blockwise).

    The last ``n_fill`` "samples" are placeholders equal to ``fill`` that are already in
    ``x``: they are removed from the result exactly.
    """
    n = int(x.size) - n_fill
    total = int(x.sum()) if x.dtype.kind == "i" else float(x.sum())
    mean = (total - fill * n_fill) / n
    acc = 0.0
    for start in range(0, int(x.size), _BLOCK):
        block = x[start : start + _BLOCK].astype(np.float64) - mean
        acc += float(np.dot(block, block))
    acc -= n_fill * (fill - mean) ** 2
    return mean, math.sqrt(max(acc, 0.0) / n)


def _summarize_excluding(
    x: I64, exclude: I64, pa: F64, ci: bool, seed: int, empty_reason: str
) -> Distribution:
    exclude = np.unique(exclude)
    n = int(x.size) - int(exclude.size)
    if n <= 0:
        return Distribution.no_data(empty_reason, [float(p) for p in pa])
    if n <= BOOTSTRAP_MAX_N:
        keep = np.ones(x.size, np.bool_)
        keep[exclude] = False
        kept = x[keep]
        return _summarize_small(kept, pa, float(kept.mean()), float(kept.std()), ci, seed)
    fill = round(float(int(x.sum()) - int(x[exclude].sum())) / n)
    x[exclude] = fill  # placeholders at about the mean: exact removal in _mean_std
    mean, std = _mean_std(x, int(exclude.size), float(fill))
    x[exclude] = _SENTINEL  # above every sample: partition ranks < n never reach them
    return _summarize_large(x, pa, mean, std, ci, n)


def _make(
    n: int,
    mean: float,
    std: float,
    mn: float,
    mx: float,
    pa: F64,
    est: F64,
    bounds: tuple[F64, F64] | None,
    method: CIMethod | None,
) -> Distribution:
    keys = [float(p) for p in pa]
    ci95: dict[float, tuple[float, float] | None] = dict.fromkeys(keys)
    if bounds is not None:
        lo = np.minimum(bounds[0], est)
        hi = np.maximum(bounds[1], est)
        ci95 = {k: (float(a), float(b)) for k, a, b in zip(keys, lo, hi, strict=True)}
    return Distribution(
        count=n,
        mean=mean,
        std=std,
        min=mn,
        max=mx,
        percentiles={k: float(v) for k, v in zip(keys, est, strict=True)},
        ci95=ci95,
        ci_method=method if bounds is not None else None,
    )


def _summarize_small(
    x: Samples, pa: F64, mean: float, std: float, ci: bool, seed: int
) -> Distribution:
    x.sort()
    n = int(x.size)
    lo, hi, frac = _positions(n, pa)
    est = _interp(x, lo, hi, frac)
    bounds = _bootstrap_bounds(x, lo, hi, frac, seed) if ci else None
    return _make(n, mean, std, float(x[0]), float(x[-1]), pa, est, bounds, "bootstrap")


def _bootstrap_bounds(xs: Samples, lo: I64, hi: I64, frac: F64, seed: int) -> tuple[F64, F64]:
    """2.5% / 97.5% of the bootstrap distribution of each percentile (see module doc)."""
    boot = _bootstrap_draws(xs, lo, hi, frac, BOOTSTRAP_RESAMPLES, np.random.default_rng(seed))
    q = np.percentile(boot, [2.5, 97.5], axis=0)
    return q[0], q[1]


def _bootstrap_draws(
    xs: Samples, lo: I64, hi: I64, frac: F64, resamples: int, rng: np.random.Generator
) -> F64:
    """Bootstrap draws of the percentiles at positions (lo, hi, frac) of sorted ``xs``:
    shape (resamples, len(lo)). The order statistics a resample's percentile reads are drawn
    jointly (uniform order statistics as normalized gamma spacings), not by resampling."""
    n = int(xs.size)
    ks = np.unique(np.concatenate([lo, hi]))  # 0-based order statistics the estimate reads
    shapes = np.diff(np.concatenate([[0], ks + 1, [n + 1]])).astype(np.float64)
    spacings = rng.standard_gamma(shapes, size=(resamples, shapes.size))
    sums = np.cumsum(spacings, axis=1)
    u = sums[:, :-1] / sums[:, -1:]
    idx = np.minimum((u * n).astype(np.int64), n - 1)
    vals = xs[idx].astype(np.float64)
    a = vals[:, np.searchsorted(ks, lo)]
    b = vals[:, np.searchsorted(ks, hi)]
    out: F64 = np.where(hi == lo, a, a + (b - a) * frac)
    return out


def bootstrap_percentiles(
    sorted_x: F64, ps: Sequence[float], resamples: int, rng: np.random.Generator
) -> F64:
    """Bootstrap draws of linear-interpolation percentiles of ``sorted_x`` (ascending, not
    empty): shape (resamples, len(ps)). The one bootstrap: the confidence intervals here
    and the comparisons' (``app.analysis.compare``) both draw with it."""
    n = int(sorted_x.shape[0])
    if n == 1:
        return np.full((resamples, len(ps)), float(sorted_x[0]), np.float64)
    lo, hi, frac = _positions(n, np.asarray(ps, np.float64))
    return _bootstrap_draws(sorted_x, lo, hi, frac, resamples, rng)


def _order_stat_ranks(n: int, pa: F64) -> tuple[I64, I64]:
    """0-based ranks of the distribution-free 95% CI for each quantile."""
    q = pa / 100.0
    half = _Z95 * np.sqrt(n * q * (1.0 - q))
    lower = np.floor(n * q - half).astype(np.int64) - 1
    upper = np.ceil(n * q + half).astype(np.int64) - 1
    return np.clip(lower, 0, n - 1), np.clip(upper, 0, n - 1)


def _summarize_large(
    x: Samples, pa: F64, mean: float, std: float, ci: bool, n: int
) -> Distribution:
    """Percentiles of the ``n`` smallest entries of ``x`` (all of them unless sentinels)."""
    lo, hi, frac = _positions(n, pa)
    c_lo, c_hi = _order_stat_ranks(n, pa)
    c_lo = np.minimum(c_lo, lo)
    c_hi = np.maximum(c_hi, hi)
    wanted = [lo, hi, np.array([0, n - 1], np.int64)]
    if ci:
        wanted += [c_lo, c_hi]
    x.partition(np.unique(np.concatenate(wanted)))
    est = _interp(x, lo, hi, frac)
    bounds = (x[c_lo].astype(np.float64), x[c_hi].astype(np.float64)) if ci else None
    return _make(n, mean, std, float(x[0]), float(x[n - 1]), pa, est, bounds, "order-statistic")


def _guidellm_pdf(values: npt.ArrayLike, weights: npt.ArrayLike) -> tuple[F64, F64]:
    """GuideLLM 0.8.1's probability mass (``DistributionSummary.from_values``): sorted values,
    equal values merged by summing their weights, zero weights dropped, each weight divided
    by the total. Non-finite values and weights, and negative weights, are dropped first."""
    v = np.asarray(values, np.float64).ravel()
    w = np.asarray(weights, np.float64).ravel()
    keep = np.isfinite(v) & np.isfinite(w) & (w >= 0)
    v, w = v[keep], w[keep]
    order = np.argsort(v)
    unique, inverse = np.unique(v[order], return_inverse=True)
    merged = np.zeros_like(unique, dtype=np.float64)
    np.add.at(merged, inverse, w[order])
    nonzero = merged > 0
    unique, merged = unique[nonzero], merged[nonzero]
    return unique, merged / np.sum(merged) if unique.size else merged


def weighted_cdf_percentiles(
    values: npt.ArrayLike, weights: npt.ArrayLike, ps: Sequence[float] = PERCENTILES
) -> dict[float, float | None]:
    """GuideLLM 0.8.1's percentiles (``Percentiles.from_pdf``): the first value whose running
    sum of probabilities reaches q = p / 100 (no interpolation), the probabilities being the
    weights already divided by their total and equal values merged (``_guidellm_pdf``): the
    floating-point running sum decides at exact boundaries, as in GuideLLM (ten equal
    weights sum to 0.8999999999999999 after nine, so p90 is the tenth value). q is p / 100
    rounded to 12 decimals (99.9 asks for GuideLLM's 0.999, not 0.9990000000000001); p100
    is the largest value (GuideLLM's ``max``). No samples -> ``None`` each.
    """
    pa = _check_ps(ps)
    v, prob = _guidellm_pdf(values, weights)
    if v.size == 0:
        return {float(p): None for p in pa}
    cdf = np.cumsum(prob)
    out: dict[float, float | None] = {}
    for p in pa:
        if p >= 100.0:
            out[float(p)] = float(v[-1])
            continue
        idx = int(np.searchsorted(cdf, round(float(p) / 100.0, 12), side="left"))
        out[float(p)] = float(v[min(idx, v.size - 1)])
    return out


def weighted_mean_std(
    values: npt.ArrayLike, weights: npt.ArrayLike
) -> tuple[float | None, float | None]:
    """Weighted mean and (population) standard deviation as GuideLLM 0.8.1 computes them from
    its probability mass: sum(v p) and sqrt(sum((v - mean)^2 p)); ``(None, None)`` without
    samples."""
    v, prob = _guidellm_pdf(values, weights)
    if v.size == 0:
        return None, None
    mean = float(np.sum(v * prob))
    var = float(np.sum((v - mean) ** 2 * prob))
    return mean, math.sqrt(var)
