"""Output throughput: output tokens of the successful requests / the observation window."""

from __future__ import annotations

from app.analysis.run_counts import rate

from .base import Metric, ProfileRow, RunTotals


def _output_throughput(t: RunTotals) -> float | None:
    return rate(t.output_tokens, t.window)


OUTPUT_THROUGHPUT = Metric(
    key="output_throughput_tok_s",
    label="Output throughput",
    title="Output throughput",
    unit="tok/s",
    decimals=1,
    aggregation="per_run",
    better="higher",
    per_run=_output_throughput,
    views=frozenset(("compare", "profile")),
    headline=("value",),
    gate=("value",),
    profile=ProfileRow(
        "output_throughput",
        "Output token throughput",
        "output tokens of successful requests / window",
    ),
)
