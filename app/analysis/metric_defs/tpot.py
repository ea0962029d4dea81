"""TPOT, time per output token: (last token-bearing event - first) / (n - 1) per request,
n its output tokens; undefined (NaN, never 0) when n < 2 or all of its tokens came in one
event (a non-streamed answer says nothing about the time between tokens). An undefined
TPOT meets a TPOT SLO, as in vLLM."""

from __future__ import annotations

import numpy as np

from .base import F64, Metric, ProfileRow, RunBasis


def _tpot(b: RunBasis) -> F64:
    t_first, t_last, n = b.t_first, b.t_last, b.n_tokens
    out = np.full(b.trace.n_requests, np.nan)
    has = b.valid & (t_first >= 0) & (n >= 2) & (b.tokens.counts >= 2)
    out[has] = (t_last[has] - t_first[has]) / (n[has] - 1).astype(np.float64)
    return out


TPOT = Metric(
    key="tpot_ms",
    label="TPOT",
    title="TPOT (per request)",
    unit="ms",
    decimals=2,
    aggregation="per_request",
    per_request=_tpot,
    empty="no request with 2+ tokens",
    seed=3,
    compare_seed=1,
    column="tpot_ns",
    slo="tpot",
    slo_undefined_passes=True,
    views=frozenset(
        {
            "page",
            "figures",
            "live",
            "table",
            "compare",
            "sweep",
            "sweep_figures",
            "turns",
            "profile",
        }
    ),
    headline=("p50",),
    gate=("p50",),
    profile=ProfileRow("tpot", "TPOT", "(t_last - t_first) / (n - 1), n >= 2"),
)
