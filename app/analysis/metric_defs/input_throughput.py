"""Input token throughput: input tokens of the successful requests / the observation window
(every run; the measure of a surface that generates no tokens, e.g. embeddings)."""

from __future__ import annotations

from app.analysis.run_counts import rate

from .base import Metric, RunTotals


def _input_throughput(t: RunTotals) -> float | None:
    return rate(t.input_tokens, t.window)


INPUT_THROUGHPUT = Metric(
    key="input_throughput_tok_s",
    label="Input throughput",
    title="Input token throughput",
    unit="tok/s",
    decimals=1,
    aggregation="per_run",
    better="higher",
    per_run=_input_throughput,
    answers=True,
    views=frozenset(("compare",)),
)
