"""Total token throughput: input + output tokens of the successful requests / the
observation window (a request without an input count adds its output tokens only)."""

from __future__ import annotations

from app.analysis.run_counts import rate

from .base import Metric, ProfileRow, RunTotals


def _total_token_throughput(t: RunTotals) -> float | None:
    return rate(t.input_tokens + t.output_tokens, t.window)


TOTAL_TOKEN_THROUGHPUT = Metric(
    key="total_token_throughput_tok_s",
    label="Total token throughput",
    title="Total token throughput",
    unit="tok/s",
    decimals=1,
    aggregation="per_run",
    better="higher",
    answers=True,
    per_run=_total_token_throughput,
    views=frozenset(("profile",)),
    profile=ProfileRow(
        "total_token_throughput",
        "Total token throughput",
        "input + output tokens of successful requests / window",
    ),
)
