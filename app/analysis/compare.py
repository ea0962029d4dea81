"""Statistical comparison of a candidate run against a baseline (pure numpy, no I/O).

Per latency metric (lower is better) and per percentile:

* **relative delta** ``(candidate - baseline) / baseline`` of the percentile;
* **bootstrap confidence interval** of the difference ``candidate - baseline`` at level
  ``1 - alpha``: both samples are resampled independently ``resamples`` times with the one
  bootstrap of ``app.analysis.percentiles.bootstrap_percentiles``. Resamples are not
  materialised: the order statistics a resample's linear-interpolation percentile reads are
  drawn directly (the k-th smallest of N indices drawn with replacement is
  ``floor(N * U_(k))``, uniform order statistics drawn jointly as normalized gamma
  spacings), at O(resamples) cost whatever N;
* **Mann-Whitney U** on the raw samples, two-sided, normal approximation with the tie
  correction and a continuity correction of 0.5 (as ``scipy.stats.mannwhitneyu`` with
  ``method="asymptotic"``).

**Bounded samples.** A side with more than ``SAMPLE_MAX`` samples of a metric (a 20M-event
run pools 20M ITL gaps) is compared through a seeded uniform subsample of ``SAMPLE_MAX`` of
them (``bounded``, drawn without replacement, ``SAMPLE_SEED``) with its exact percentiles
and count beside it (``FullStats``): the percentiles, deltas and counts shown are exact, the
bootstrap interval and the rank test come from the subsample (wider, so a verdict is
never easier to reach), and a note says so. Sides within the bound use every sample.

Verdict of one percentile: *regressed* / *improved* when ``|delta| >= threshold`` **and** the
``1 - alpha`` bootstrap interval of the difference excludes 0 **and**, for the median, the
rank test gives ``p < alpha``; else *no significant change*. Tail percentiles are judged by
their bootstrap interval (a rank test speaks about the whole distribution, not its tail).
A metric regressed when any of its percentiles did; improved when some improved and none
regressed. Error rate uses a two-proportion z-test; throughputs are single values per run
and get a delta only (never a verdict).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from app.analysis.percentiles import bootstrap_percentiles, percentile_key, percentiles

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

Verdict = Literal["improved", "regressed", "no significant change", "no data"]
DEFAULT_THRESHOLD = 0.05
DEFAULT_ALPHA = 0.01
DEFAULT_RESAMPLES = 2000
COMPARE_PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0)
SAMPLE_MAX = 200_000  # samples per metric and run a comparison holds (see the module doc)
SAMPLE_SEED = 0


def _phi_sf(z: float) -> float:
    """Upper tail of the standard normal: P(Z > z)."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


@dataclass(frozen=True, slots=True)
class RankTest:
    """Mann-Whitney U of sample x against y: ``u`` is U of x (pairs where x > y, ties 1/2)."""

    u: float
    z: float
    p_value: float
    n_x: int
    n_y: int


def rank_average(values: F64) -> tuple[F64, I64]:
    """Average ranks (1-based; ties share the mean of their ranks) and the tie group sizes."""
    n = values.shape[0]
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    starts = np.flatnonzero(np.concatenate([[True], ordered[1:] != ordered[:-1]]))
    sizes = np.diff(np.concatenate([starts, [n]])).astype(np.int64)
    mean_rank = starts + (sizes + 1) / 2.0  # ranks start..start+size-1, 1-based
    ranks = np.empty(n, np.float64)
    ranks[order] = np.repeat(mean_rank, sizes)
    return ranks, sizes


def mann_whitney_u(x: npt.ArrayLike, y: npt.ArrayLike, *, continuity: bool = True) -> RankTest:
    """Two-sided Mann-Whitney U test, normal approximation with tie correction.

    ``sigma^2 = n1 n2 / 12 * ((n + 1) - sum(t^3 - t) / (n (n - 1)))``; ``z = (U - n1 n2 / 2
    -/+ 0.5) / sigma``; ``p = 2 P(Z > |z|)`` (capped at 1). All values equal: p = 1.
    Raises ValueError when a sample is empty or holds NaN.
    """
    a = np.asarray(x, np.float64).ravel()
    b = np.asarray(y, np.float64).ravel()
    if a.size == 0 or b.size == 0:
        raise ValueError("Mann-Whitney U needs at least one sample on each side")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("Mann-Whitney U: samples must be finite")
    n1, n2 = int(a.size), int(b.size)
    n = n1 + n2
    ranks, ties = rank_average(np.concatenate([a, b]))
    u = float(ranks[:n1].sum() - n1 * (n1 + 1) / 2.0)
    mu = n1 * n2 / 2.0
    tie_term = float(np.sum(ties.astype(np.float64) ** 3 - ties)) / (n * (n - 1)) if n > 1 else 0.0
    var = n1 * n2 / 12.0 * ((n + 1) - tie_term)
    if var <= 0:
        return RankTest(u=u, z=0.0, p_value=1.0, n_x=n1, n_y=n2)
    diff = u - mu
    if continuity:
        diff = math.copysign(max(abs(diff) - 0.5, 0.0), diff)
    z = diff / math.sqrt(var)
    return RankTest(u=u, z=z, p_value=min(1.0, 2.0 * _phi_sf(abs(z))), n_x=n1, n_y=n2)


def two_proportion_test(k1: int, n1: int, k2: int, n2: int) -> float | None:
    """Two-sided p-value that two binomial proportions k1/n1 and k2/n2 are equal (pooled z);
    None when a side has no trials; 1.0 when the pooled proportion is 0 or 1."""
    if n1 <= 0 or n2 <= 0:
        return None
    pooled = (k1 + k2) / (n1 + n2)
    var = pooled * (1 - pooled) * (1 / n1 + 1 / n2)
    if var <= 0:
        return 1.0
    z = (k2 / n2 - k1 / n1) / math.sqrt(var)
    return min(1.0, 2.0 * _phi_sf(abs(z)))


@dataclass(frozen=True, slots=True)
class PercentileDelta:
    p: float
    baseline: float | None
    candidate: float | None
    delta: float | None  # candidate - baseline
    rel_delta: float | None  # delta / baseline
    ci_low: float | None  # bootstrap interval of delta, level 1 - alpha
    ci_high: float | None
    verdict: Verdict

    @property
    def key(self) -> str:
        return percentile_key(self.p)

    def to_dict(self) -> dict[str, object]:
        return {
            "p": self.p,
            "key": self.key,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "delta": self.delta,
            "rel_delta": self.rel_delta,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "verdict": self.verdict,
        }


@dataclass(frozen=True, slots=True)
class MetricComparison:
    metric: str
    n_baseline: int
    n_candidate: int
    rank_test: RankTest | None
    percentiles: list[PercentileDelta]
    verdict: Verdict
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        rt = self.rank_test
        return {
            "metric": self.metric,
            "n_baseline": self.n_baseline,
            "n_candidate": self.n_candidate,
            "mann_whitney": None if rt is None else {"u": rt.u, "z": rt.z, "p_value": rt.p_value},
            "percentiles": [p.to_dict() for p in self.percentiles],
            "verdict": self.verdict,
            "notes": list(self.notes),
        }


@dataclass(frozen=True, slots=True)
class CompareOptions:
    threshold: float = DEFAULT_THRESHOLD  # relative, 0.05 = 5%
    alpha: float = DEFAULT_ALPHA
    ps: tuple[float, ...] = COMPARE_PERCENTILES
    resamples: int = DEFAULT_RESAMPLES
    seed: int = 0

    def __post_init__(self) -> None:
        if not (0 <= self.threshold < 10 and math.isfinite(self.threshold)):
            raise ValueError(f"threshold must be a fraction in [0, 10), got {self.threshold}")
        if not (0 < self.alpha < 1):
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.resamples < 100:
            raise ValueError(f"resamples must be at least 100, got {self.resamples}")
        if not self.ps or any(not 0 <= p <= 100 for p in self.ps):
            raise ValueError(f"percentiles must be in [0, 100], got {list(self.ps)}")


def _finite(values: npt.ArrayLike) -> F64:
    a = np.asarray(values, np.float64).ravel()
    out: F64 = a[np.isfinite(a)]
    return out


@dataclass(frozen=True, slots=True)
class FullStats:
    """Of every sample of a side whose values were subsampled: how many there were and their
    exact percentiles by p (a missing or None one is taken from the subsample)."""

    n: int
    percentiles: dict[float, float | None]


def bounded(values: npt.ArrayLike, k: int = SAMPLE_MAX, seed: int = SAMPLE_SEED) -> tuple[F64, int]:
    """(the finite values, or a seeded uniform subsample of ``k`` of them drawn without
    replacement, kept in their order; how many finite values there were)."""
    a = np.asarray(values, np.float64).ravel()
    ok = np.isfinite(a)
    if not ok.all():  # else no filtered copy of a pooled sample of millions
        a = a[ok]
    del ok
    n = int(a.shape[0])
    if n <= k:
        return a, n
    idx = np.sort(np.random.default_rng(seed).choice(n, size=k, replace=False))
    out: F64 = a[idx]
    return out, n


def _subsample_note(side: str, full: FullStats, k: int) -> str:
    return (
        f"{side}: {full.n:,} samples; the interval and the rank test use a seeded random "
        f"subsample of {k:,} of them (the percentiles are exact)"
    )


def _judge(
    rel: float, ci: tuple[float, float], p_value: float | None, opts: CompareOptions
) -> Verdict:
    if abs(rel) < opts.threshold:
        return "no significant change"
    if ci[0] <= 0.0 <= ci[1]:
        return "no significant change"
    if p_value is not None and not p_value < opts.alpha:
        return "no significant change"
    return "regressed" if rel > 0 else "improved"


def combine_verdicts(verdicts: Sequence[Verdict]) -> Verdict:
    """Regressed if any regressed; improved if any improved and none regressed."""
    if "regressed" in verdicts:
        return "regressed"
    if "improved" in verdicts:
        return "improved"
    if verdicts and all(v == "no data" for v in verdicts):
        return "no data"
    return "no significant change"


def compare_samples(
    metric: str,
    baseline: npt.ArrayLike,
    candidate: npt.ArrayLike,
    opts: CompareOptions | None = None,
    *,
    baseline_full: FullStats | None = None,
    candidate_full: FullStats | None = None,
) -> MetricComparison:
    """Compare two samples of a lower-is-better metric (NaN = undefined, dropped).

    ``baseline_full`` / ``candidate_full``: the side's values are a subsample (``bounded``)
    of these; its counts and percentiles are shown exact."""
    o = opts or CompareOptions()
    a = np.sort(_finite(baseline))
    b = np.sort(_finite(candidate))
    if a.size == 0 or b.size == 0:
        side = "baseline" if a.size == 0 else "candidate"
        empty = [PercentileDelta(p, None, None, None, None, None, None, "no data") for p in o.ps]
        return MetricComparison(
            metric, int(a.size), int(b.size), None, empty, "no data", [f"no {side} samples"]
        )
    rt = mann_whitney_u(b, a)
    rng = np.random.default_rng(o.seed)
    diffs = bootstrap_percentiles(b, o.ps, o.resamples, rng) - bootstrap_percentiles(
        a, o.ps, o.resamples, rng
    )
    tail = 100.0 * o.alpha / 2.0
    lows, highs = np.percentile(diffs, [tail, 100.0 - tail], axis=0)
    pa = _exact(percentiles(a, o.ps), baseline_full)
    pb = _exact(percentiles(b, o.ps), candidate_full)
    n_a = baseline_full.n if baseline_full is not None else int(a.size)
    n_b = candidate_full.n if candidate_full is not None else int(b.size)
    rows: list[PercentileDelta] = []
    notes: list[str] = [
        _subsample_note(side, full, int(x.size))
        for side, full, x in (("baseline", baseline_full, a), ("candidate", candidate_full, b))
        if full is not None
    ]
    for j, p in enumerate(o.ps):
        va, vb = pa[float(p)], pb[float(p)]
        assert va is not None and vb is not None
        delta = vb - va
        ci = (float(lows[j]), float(highs[j]))
        if va == 0:
            rel = None
            verdict: Verdict = "no significant change"
            notes.append(f"p{p:g}: baseline is 0, no relative change")
        else:
            rel = delta / abs(va)
            verdict = _judge(rel, ci, rt.p_value if p == 50.0 else None, o)
        rows.append(PercentileDelta(float(p), va, vb, delta, rel, ci[0], ci[1], verdict))
    if min(n_a, n_b) < 20:
        notes.append(f"few samples ({min(n_a, n_b)}): intervals are wide")
    return MetricComparison(
        metric,
        n_a,
        n_b,
        rt,
        rows,
        combine_verdicts([r.verdict for r in rows]),
        notes,
    )


def _exact(sampled: dict[float, float | None], full: FullStats | None) -> dict[float, float | None]:
    if full is None:
        return sampled
    out = dict(sampled)
    for p, v in full.percentiles.items():
        if v is not None and float(p) in out:
            out[float(p)] = float(v)
    return out


@dataclass(frozen=True, slots=True)
class ErrorRateComparison:
    baseline: float | None
    candidate: float | None
    p_value: float | None
    verdict: Verdict

    def to_dict(self) -> dict[str, object]:
        return {
            "baseline": self.baseline,
            "candidate": self.candidate,
            "p_value": self.p_value,
            "verdict": self.verdict,
        }


def compare_error_rates(
    failed_a: int, sent_a: int, failed_b: int, sent_b: int, opts: CompareOptions | None = None
) -> ErrorRateComparison:
    """Error rate (failed / sent): regressed when the candidate's is higher by at least
    ``threshold`` in absolute terms (5% = 0.05) with p < alpha (two-proportion z-test)."""
    o = opts or CompareOptions()
    if sent_a <= 0 or sent_b <= 0:
        return ErrorRateComparison(None, None, None, "no data")
    ra, rb = failed_a / sent_a, failed_b / sent_b
    p = two_proportion_test(failed_a, sent_a, failed_b, sent_b)
    verdict: Verdict = "no significant change"
    if p is not None and p < o.alpha and abs(rb - ra) >= o.threshold:
        verdict = "regressed" if rb > ra else "improved"
    return ErrorRateComparison(ra, rb, p, verdict)


def relative(baseline: float | None, candidate: float | None) -> float | None:
    """``(candidate - baseline) / |baseline|``; None when either is missing or baseline is 0."""
    if baseline is None or candidate is None or baseline == 0:
        return None
    return (candidate - baseline) / abs(baseline)
