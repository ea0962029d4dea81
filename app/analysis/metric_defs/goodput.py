"""Goodput: requests meeting every SLO in force / the observation window; none without
SLOs (``app.analysis.goodput`` decides which requests are good)."""

from __future__ import annotations

from app.analysis.run_counts import rate

from .base import Metric, RunTotals


def _goodput(t: RunTotals) -> float | None:
    return None if t.good is None else rate(t.good, t.window)


GOODPUT = Metric(
    key="goodput_req_s",
    label="Goodput",
    title="Goodput",
    unit="req/s",
    decimals=2,
    aggregation="per_run",
    better="higher",
    answers=True,
    per_run=_goodput,
    uses_slos=True,
    views=frozenset(("compare",)),
    headline=("value",),
)
