"""ITL per chunk, pooled: one sample per consecutive pair of token-bearing chunks of a
successful request, whatever the tokens each carried. A summary-only run has none."""

from __future__ import annotations

from app.analysis.event_views import NS_PER_MS, SUMMARY_ONLY_REASON
from app.analysis.percentiles import Distribution, summarize

from .base import Metric, ProfileRow, RunBasis


def _itl_chunk(b: RunBasis) -> Distribution:
    if b.trace.summary_only:
        return Distribution.no_data(SUMMARY_ONLY_REASON)
    s = b.itl
    dist = summarize(
        s.chunk_gaps, ci=b.ci, seed=b.seed + ITL_CHUNK.seed, owned=True, exclude=s.chunk_exclude
    )
    return dist.divided(NS_PER_MS)


ITL_CHUNK = Metric(
    key="itl_chunk_ms",
    label="ITL/chunk",
    title="ITL (per chunk, pooled)",
    unit="ms",
    decimals=2,
    aggregation="per_chunk_pooled",
    pooled=_itl_chunk,
    seed=5,
    views=frozenset(("page", "profile")),
    profile=ProfileRow(
        "itl_chunk", "ITL (per chunk)", "gap between consecutive token-bearing chunks"
    ),
)
