"""TTFT, time to first token: the first token-bearing event (content or reasoning) - the
request's send, one sample per successful request (SPEC §1)."""

from __future__ import annotations

from .base import F64, Metric, ProfileRow, RunBasis


def _ttft(b: RunBasis) -> F64:
    return b.since_sent(b.t_first)


TTFT = Metric(
    key="ttft_ms",
    label="TTFT",
    title="TTFT",
    unit="ms",
    decimals=2,
    aggregation="per_request",
    per_request=_ttft,
    seed=0,
    compare_seed=0,
    column="ttft_ns",
    slo="ttft",
    views=frozenset(
        {
            "page",
            "figures",
            "live",
            "table",
            "compare",
            "sweep",
            "sweep_figures",
            "sweep_load",
            "turns",
            "profile",
        }
    ),
    headline=("p50", "p99"),
    gate=("p99",),
    profile=ProfileRow("ttft", "TTFT", "first token-bearing chunk - send"),
)
