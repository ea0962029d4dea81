"""E2E latency: the last token-bearing event - the request's send (not the server's "done"
signal), one sample per successful request; for a surface that answers once (embeddings,
rerank: ``app.analysis.answers``) its answer's arrival - send. A request without one is never
good (goodput): it was not answered."""

from __future__ import annotations

from .base import F64, Metric, ProfileRow, RunBasis


def _e2el(b: RunBasis) -> F64:
    return b.since_sent(b.t_last)


E2EL = Metric(
    key="e2el_ms",
    label="E2E latency",
    title="E2E latency",
    unit="ms",
    decimals=2,
    aggregation="per_request",
    short="E2E",
    per_request=_e2el,
    seed=2,
    compare_seed=2,
    column="e2e_ns",
    slo="e2el",
    goodput_requires=True,
    answers=True,
    gate=("p99",),
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
            "profile",
        }
    ),
    profile=ProfileRow("e2el", "E2E", "last token-bearing chunk - send"),
)
