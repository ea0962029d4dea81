"""The server's prefix-cache hit ratio over a run, from its scraped counters. Pure.

vLLM counts prompt tokens looked up in its prefix cache and those found
(``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total``; older versions
``vllm:gpu_prefix_cache_queries_total`` / ``..._hits_total``, some versions both: the first
is used): the hit ratio over the run is
the hits' increase over the queries' (first scrape, before the load, to the last, after it;
warm-ups included). A server that exposes neither counter gives None.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.protocol.prometheus import KNOWN_SERIES, Series, counter_increase


def _increase(series: Sequence[Series], role: str) -> float | None:
    """The summed increase of the role's first name that was scraped (vLLM 0.8 to 0.10
    expose both names of one counter: only one is counted)."""
    for name in KNOWN_SERIES[role]:
        found = [s for s in series if s.name == name and len(s.values) >= 2]
        if found:
            return sum(counter_increase(s.values) for s in found)
    return None


def prefix_cache(series: Sequence[Series]) -> dict[str, Any] | None:
    """Tokens queried and hit over the run and their ratio (None when no query was counted);
    None when the server exposes no prefix-cache counters (or was scraped once)."""
    queries = _increase(series, "prefix_cache_queries")
    hits = _increase(series, "prefix_cache_hits")
    if queries is None or hits is None:
        return None
    return {
        "source": "vllm",
        "queried_tokens": queries,
        "hit_tokens": hits,
        "hit_ratio": hits / queries if queries > 0 else None,
        "basis": "vLLM counters: prefix_cache_hits increase / prefix_cache_queries increase",
    }
