"""The server's prefix-cache hit ratio over a run, from its scraped counters. Pure.

vLLM counts prompt tokens looked up in its prefix cache and those found
(``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total``; older versions
``vllm:gpu_prefix_cache_queries_total`` / ``..._hits_total``, some versions both: the first
is used): the hit ratio over the run is
the hits' increase over the queries' (first scrape, before the load, to the last, after it;
warm-ups included). A server that exposes neither counter gives None.

``responses_prefix_cache``: the same ratio from the responses instead, for a server without
those counters whose usage objects report the cached prompt tokens (llama.cpp; vLLM with
``--enable-prompt-tokens-details``): summed over a multi-turn run's turn table
(``app.analysis.turns``) or over any run's records (``records_prefix_cache``), successful
measured requests that reported a count (``cached_share``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from app.domain import RequestRecord, RequestStatus
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


def responses_prefix_cache(turns: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Prompt tokens and cached prompt tokens summed over the turns' requests that reported
    a cached count, and their ratio; None when no request reported one (or the table
    predates the count)."""
    hit = queried = 0
    requests = 0
    for row in turns:
        c, p = row.get("cached_tokens_sum"), row.get("cache_prompt_tokens_sum")
        stats = row.get("cached_prompt_tokens")
        if isinstance(c, int) and isinstance(p, int):
            hit, queried = hit + c, queried + p
            requests += int(stats.get("n") or 0) if isinstance(stats, Mapping) else 0
    return cached_share(requests, hit, queried)


def records_prefix_cache(records: Sequence[RequestRecord]) -> dict[str, Any] | None:
    """``cached_share`` over a run's successful measured requests that reported a cached
    count (their prompt tokens: the server's ``usage.prompt_tokens``, else the count used)."""
    requests = hit = queried = 0
    for r in records:
        if r.warmup or r.status is not RequestStatus.OK or r.cached_prompt_tokens is None:
            continue
        prompt = r.usage_prompt_tokens if r.usage_prompt_tokens is not None else r.input_tokens
        requests += 1
        hit += r.cached_prompt_tokens
        queried += prompt or 0
    return cached_share(requests, hit, queried)


def cached_share(requests: int, hit: int, queried: int) -> dict[str, Any] | None:
    """The share of prompt tokens the responses said came from the server's prefix cache:
    ``hit`` cached of ``queried`` prompt tokens over ``requests`` requests that reported a
    count; None when none did."""
    if not requests:
        return None
    return {
        "source": "responses",
        "queried_tokens": queried,
        "hit_tokens": hit,
        "hit_ratio": hit / queried if queried > 0 else None,
        "requests": requests,
        "basis": "usage.prompt_tokens_details.cached_tokens (or llama.cpp timings.cache_n) "
        "over the same requests' prompt tokens; successful measured requests",
    }
