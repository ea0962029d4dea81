"""Request throughput: successful requests / the observation window (one number per run)."""

from __future__ import annotations

from app.analysis.run_counts import rate

from .base import Metric, ProfileRow, RunTotals


def _request_throughput(t: RunTotals) -> float | None:
    return rate(t.ok, t.window)


REQUEST_THROUGHPUT = Metric(
    key="request_throughput_req_s",
    label="Request throughput",
    title="Request throughput",
    unit="req/s",
    decimals=2,
    aggregation="per_run",
    better="higher",
    answers=True,
    per_run=_request_throughput,
    views=frozenset(("compare", "profile")),
    profile=ProfileRow("request_throughput", "Request throughput", "successful requests / window"),
)
