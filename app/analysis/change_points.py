"""Change points of a series of runs: E-Divisive means (Matteson & James, "A Nonparametric
Approach for Multiple Change Point Analysis of Multivariate Data", JASA 2014), as MongoDB
runs it on its performance CI (Daly et al., "The Use of Change Point Detection to Identify
Software Performance Regressions in a Continuous Integration System", ICPE 2020). Pure numpy.

**The statistic.** A window ``z_0 .. z_{n-1}`` split at ``tau`` into ``X = z_0 .. z_{tau-1}``
(``m = tau`` values) and ``Y = z_tau .. z_{n-1}`` (``k = n - tau``), with exponent 1::

    E(X, Y) = 2/(m k) sum_ij |x_i - y_j| - C(m,2)^-1 sum_{i<l} |x_i - x_l|
                                         - C(k,2)^-1 sum_{j<l} |y_j - y_l|
    q(tau)  = m k / (m + k) * E(X, Y)

The candidate of a window is the ``tau`` of the largest ``q`` with at least ``min_size``
values on each side; as in MongoDB's implementation the split's far end is the window's
end (no search over kappa). **Hierarchical.** The series is cut at the change points found
so far; the best candidate of all windows is tested, and if significant becomes a change
point, until one is not. **Significance** by permutation: each window's values are
shuffled independently, ``permutations`` times; ``p = #(best q of a shuffled series >=
q) / (permutations + 1)``; a change point when ``p <= pvalue``. The shuffles come from a
seeded generator: one series always gives the same change points. A test stops as soon
as its outcome is decided (too many shuffles already beat the candidate).

**Computation**, O(n log^2 n) per window and shuffle, no n x n matrix:
``r_t = sum_{i<t} |z_t - z_i|`` for every ``t`` (``earlier_abs_sums``: the sum over
earlier values greater than ``z_t`` comes from a merge over index halves, vectorised over
all shuffles at once); the within-``X`` sum at ``tau`` is ``sum_{t<tau} r_t``, the
within-``Y`` sum ``sum_{t>=tau} (s_t - r_t)`` where ``s_t = sum_j |z_t - z_j|`` (from the
sorted values), and the cross sum is the total less both.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

DEFAULT_PVALUE = 0.01
DEFAULT_PERMUTATIONS = 100
DEFAULT_MIN_SIZE = 2  # values on each side of a change point, at least
DEFAULT_SEED = 0
SMALL_BLOCK = 8  # sibling blocks this small are compared value by value
BATCH = 20  # shuffles evaluated together (a decided test stops between batches)
MAX_POINTS = 100_000  # a longer series is refused (each window is held whole per shuffle)


@dataclass(frozen=True, slots=True)
class ChangePoint:
    index: int  # the first value of the new segment
    q: float  # the statistic at the split
    p_value: float  # #(shuffles with a larger best q) / (permutations + 1)

    def to_dict(self) -> dict[str, float | int]:
        return {"index": self.index, "q": self.q, "p_value": self.p_value}


def _sorted(x: F64) -> tuple[I64, F64]:
    """Each value's rank in its row (0-based; ties in some order) and the row's values
    sorted: one sort of ``x``."""
    order = np.argsort(x, axis=1)
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(x.shape[1])[None, :], axis=1)
    return ranks, np.take_along_axis(x, order, axis=1)


def earlier_abs_sums(x: npt.ArrayLike) -> F64:
    """``r[p, t] = sum_{i<t} |x[p, t] - x[p, i]|`` for each row ``p`` of ``x``.

    ``sum_{i<t} (x_t - x_i)`` plus twice the sum of ``x_i - x_t`` over earlier ``x_i >
    x_t``; the latter from sibling index blocks of sizes 1, 2, 4 ...: for each ``t`` in a
    right block, the count and sum of the left block's values ranked above it (compared
    directly in small blocks; in larger ones, sorted left blocks and one ``searchsorted``
    over all blocks and rows at once)."""
    arr = np.atleast_2d(np.asarray(x, np.float64))
    if arr.shape[1] == 0:
        return np.zeros((arr.shape[0], 0))
    ranks, by_rank = _sorted(arr)
    return _earlier(arr, ranks, by_rank)


def _earlier(arr: F64, ranks: I64, by_rank: F64) -> F64:
    rows, n = arr.shape
    prefix = np.cumsum(arr, axis=1) - arr
    out: F64 = np.arange(n)[None, :] * arr - prefix
    if n == 1:
        return out
    n2 = 1 << (n - 1).bit_length()
    pad = n2 - n
    r = np.pad(ranks, ((0, 0), (0, pad)), constant_values=n)  # pads: never "earlier"
    values = np.pad(by_rank, ((0, 0), (0, 1)))  # value of rank n (a pad): 0, never summed
    count_gt = np.zeros((rows, n2))
    sum_gt = np.zeros((rows, n2))
    stride = n2 + 1
    b = 1
    while b < n2:
        groups = n2 // (2 * b)
        blocks = r.reshape(rows, groups, 2, b)  # a left block, then its right sibling
        left = np.sort(blocks[:, :, 0, :], axis=-1)
        right = blocks[:, :, 1, :]
        left_vals = np.take_along_axis(values, left.reshape(rows, -1), axis=1)
        csum = np.zeros((rows, groups, b + 1))
        np.cumsum(left_vals.reshape(rows, groups, b), axis=-1, out=csum[:, :, 1:])
        if b <= SMALL_BLOCK:  # compare directly
            le = (left[:, :, :, None] < right[:, :, None, :]).sum(axis=2)
        else:  # one search over every block of every row: keys (block, rank) in order
            gid = (np.arange(rows)[:, None] * groups + np.arange(groups)[None, :])[:, :, None]
            keys = (gid * stride + left).ravel()
            pos = np.searchsorted(keys, (gid * stride + right).ravel(), side="right")
            le = pos.reshape(rows, groups, b) - gid * b  # left values ranked below
        cg = count_gt.reshape(rows, groups, 2, b)
        sg = sum_gt.reshape(rows, groups, 2, b)
        cg[:, :, 1, :] += b - le
        sg[:, :, 1, :] += csum[:, :, -1:] - np.take_along_axis(csum, le, axis=-1)
        b *= 2
    greater = sum_gt[:, :n] - arr * count_gt[:, :n]
    result: F64 = out + 2.0 * greater
    return result


def _abs_row_sums(ranks: I64, v: F64) -> F64:
    """``s[p, t] = sum_j |x[p, t] - x[p, j]|`` from each value's rank and the sorted values
    ``v``: for rank k of n, ``v_k (2k - n) - 2 sum_{j<k} v_j + sum v``."""
    n = v.shape[1]
    below = np.cumsum(v, axis=1) - v
    k = np.arange(n)[None, :]
    by_rank = v * (2 * k - n) - 2.0 * below + v.sum(axis=1, keepdims=True)
    out: F64 = np.take_along_axis(by_rank, ranks, axis=1)
    return out


def q_values(x: npt.ArrayLike, *, min_size: int = DEFAULT_MIN_SIZE) -> F64:
    """``q(tau)`` of each row of ``x`` for every split ``tau`` (``-inf`` where a side would
    have fewer than ``min_size`` values)."""
    arr = np.atleast_2d(np.asarray(x, np.float64))
    rows, n = arr.shape
    q = np.full((rows, n), -np.inf)
    lo, hi = max(min_size, 2), n - max(min_size, 2)
    if hi < lo:
        return q
    ranks, v = _sorted(arr)
    r = _earlier(arr, ranks, v)
    later = _abs_row_sums(ranks, v) - r
    within_x = np.cumsum(r, axis=1) - r  # sum over pairs before tau
    within_y = np.cumsum(later[:, ::-1], axis=1)[:, ::-1]  # pairs at or after tau
    total = r.sum(axis=1, keepdims=True)
    tau = np.arange(lo, hi + 1)
    wx, wy = within_x[:, tau], within_y[:, tau]
    cross = total - wx - wy
    m = tau.astype(np.float64)
    k = n - m
    e = 2.0 * cross / (m * k) - wx / (m * (m - 1) / 2) - wy / (k * (k - 1) / 2)
    q[:, tau] = (m * k / (m + k)) * e
    return q


def _windows(n: int, points: list[int]) -> list[tuple[int, int]]:
    cuts = [0, *sorted(points), n]
    return list(itertools.pairwise(cuts))


def _best(z: F64, a: int, b: int, min_size: int) -> tuple[int, float] | None:
    q = q_values(z[a:b], min_size=min_size)[0]
    if not np.isfinite(q).any():
        return None
    i = int(np.argmax(q))
    return a + i, float(q[i])


def _significant(
    z: F64,
    windows: list[tuple[int, int]],
    q_obs: float,
    *,
    pvalue: float,
    permutations: int,
    min_size: int,
    rng: np.random.Generator,
) -> tuple[bool, float]:
    """The permutation test of a candidate with statistic ``q_obs`` (each window shuffled
    on its own): (significant, p). Stops once the outcome is decided."""
    allowed = math.floor(pvalue * (permutations + 1) + 1e-9)  # beaten this often at most
    beaten = done = 0
    while done < permutations:
        size = min(BATCH, permutations - done)
        best = np.full(size, -np.inf)
        for a, b in windows:
            if b - a < 2 * max(min_size, 2):
                continue
            shuffled = rng.permuted(np.broadcast_to(z[a:b], (size, b - a)), axis=1)
            best = np.maximum(best, q_values(shuffled, min_size=min_size).max(axis=1))
        beaten += int((best >= q_obs).sum())
        done += size
        if beaten > allowed:
            return False, beaten / (done + 1)
    return True, beaten / (permutations + 1)


def e_divisive(
    values: npt.ArrayLike,
    *,
    pvalue: float = DEFAULT_PVALUE,
    permutations: int = DEFAULT_PERMUTATIONS,
    min_size: int = DEFAULT_MIN_SIZE,
    seed: int = DEFAULT_SEED,
) -> list[ChangePoint]:
    """The significant change points of ``values`` (finite numbers, in series order),
    sorted by index. ValueError on a bad argument or a non-finite value."""
    z = np.asarray(values, np.float64).ravel()
    if not 0 < pvalue < 1:
        raise ValueError(f"pvalue must be in (0, 1), got {pvalue}")
    if not 1 <= permutations <= 10_000:
        raise ValueError(f"permutations must be 1 to 10000, got {permutations}")
    if not 2 <= min_size <= 1000:
        raise ValueError(f"min_size must be 2 to 1000, got {min_size}")
    if z.size > MAX_POINTS:
        raise ValueError(f"at most {MAX_POINTS:,} values, got {z.size:,}")
    if not np.isfinite(z).all():
        raise ValueError("values must be finite numbers")
    rng = np.random.default_rng(seed)
    found: list[ChangePoint] = []
    memo: dict[tuple[int, int], tuple[int, float] | None] = {}
    while True:
        windows = _windows(int(z.size), [c.index for c in found])
        candidates: list[tuple[int, float]] = []
        for w in windows:
            if w not in memo:
                memo[w] = _best(z, w[0], w[1], min_size)
            best = memo[w]
            if best is not None:
                candidates.append(best)
        if not candidates:
            break
        index, q = max(candidates, key=lambda c: (c[1], -c[0]))
        if not q > 0:
            break
        ok, p = _significant(
            z, windows, q, pvalue=pvalue, permutations=permutations, min_size=min_size, rng=rng
        )
        if not ok:
            break
        found.append(ChangePoint(index, q, p))
    return sorted(found, key=lambda c: c.index)
