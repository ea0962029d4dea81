"""TTFOT, time to first output token: the first token-bearing *content* event (reasoning
left out) - the request's send, one sample per successful request."""

from __future__ import annotations

from .base import F64, Metric, ProfileRow, RunBasis


def _ttfot(b: RunBasis) -> F64:
    return b.since_sent(b.content.first_t())


TTFOT = Metric(
    key="ttfot_ms",
    label="TTFOT",
    title="Time to first output token",
    unit="ms",
    decimals=2,
    aggregation="per_request",
    per_request=_ttfot,
    seed=1,
    column="ttfot_ns",
    views=frozenset(("page", "figures", "profile")),
    profile=ProfileRow("ttfot", "TTFOT", "first content (non-reasoning) chunk - send"),
)
