"""ITL per token, pooled: a chunk of k tokens arriving g after the previous token-bearing
chunk of its request gives k samples g/k; a request's first chunk of k tokens gives k - 1
samples of 0 (``app.analysis.event_views.itl_samples``). When every chunk carried one token
these are the per-chunk gaps (``itl_chunk``). A summary-only run (an imported log) has no
per-token times: no samples."""

from __future__ import annotations

import numpy as np

from app.analysis.event_views import NS_PER_MS, SUMMARY_ONLY_REASON, itl_samples_ms
from app.analysis.percentiles import Distribution, summarize

from .base import F64, Metric, ProfileRow, RunBasis
from .itl_chunk import ITL_CHUNK


def _itl(b: RunBasis) -> Distribution:
    if b.trace.summary_only:
        return Distribution.no_data(SUMMARY_ONLY_REASON)
    per_token = b.itl.per_token
    if per_token is None:  # every chunk carried one token: the per-chunk samples
        return b.distribution(ITL_CHUNK.key)
    return summarize(per_token, ci=b.ci, seed=b.seed + ITL.seed, owned=True).divided(NS_PER_MS)


def _samples(b: RunBasis) -> F64:
    if b.trace.summary_only:
        return np.zeros(0)
    return itl_samples_ms(b.trace, b.tokens)


ITL = Metric(
    key="itl_ms",
    label="ITL",
    title="ITL (per token, pooled)",
    unit="ms",
    decimals=2,
    aggregation="per_token_pooled",
    pooled=_itl,
    samples=_samples,
    empty="no successful request with two tokens",
    seed=4,
    compare_seed=3,
    views=frozenset(("page", "figures", "compare", "sweep", "profile")),
    profile=ProfileRow(
        "itl", "ITL", "per-token gap: a chunk of k tokens after gap g gives k samples g/k"
    ),
)
