"""Every metric tokentrace reports, defined once: its report key, names, unit, display
decimals, what one sample is (its aggregation), what it is computed from, and its goodput
SLO. The report (``app.analysis.metrics``), the CLI, the run and compare pages, their
figures and the exports read these definitions; ``docs/metrics.md`` says how each is
measured.

Decimals are one rule per unit, the same in every cell of a column: latencies in ms with 2
decimals (sub-millisecond ITL/TPOT differences stay visible), token rates with 1, request
rates with 2; relative changes as a signed percentage with 1 decimal."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

Aggregation = Literal["per_request", "per_token_pooled", "per_chunk_pooled", "per_run"]
AGG_SHORT: Mapping[str, str] = MappingProxyType(
    {
        "per_request": "request",
        "per_token_pooled": "token",
        "per_chunk_pooled": "chunk",
        "per_run": "run",
    }
)


@dataclass(frozen=True, slots=True)
class Metric:
    key: str  # the report's key: "ttft_ms"
    label: str  # short, for tables and axes: "TTFT"
    title: str  # long, for page rows and figure titles: "Time to first token"
    unit: str  # "ms", "tok/s", "req/s"
    decimals: int  # digits after the point wherever the value is shown
    aggregation: Aggregation  # what one sample is
    source: str  # what it is computed from: a PerRequestMetrics field, "itl", or "run"
    slo: str | None = None  # the goodput SLO that bounds it ("ttft" in --goodput ttft:150)
    better: Literal["lower", "higher"] = "lower"

    @property
    def heading(self) -> str:
        """``TTFT (ms)``: the label with its unit."""
        return f"{self.label} ({self.unit})"

    @property
    def per(self) -> str:
        """What one sample is, in a word: request, token, chunk, run."""
        return AGG_SHORT[self.aggregation]


# latency distributions, in the report's order (a page or the CLI may show them in its own)
LATENCIES: tuple[Metric, ...] = (
    Metric("ttft_ms", "TTFT", "TTFT", "ms", 2, "per_request", "ttft_ns", "ttft"),
    Metric(
        "user_ttft_ms",
        "TTFT+setup",
        "TTFT with connection setup",
        "ms",
        2,
        "per_request",
        "user_ttft_ns",
        "user_ttft",
    ),
    Metric("ttfot_ms", "TTFOT", "Time to first output token", "ms", 2, "per_request", "ttfot_ns"),
    Metric("e2el_ms", "E2E latency", "E2E latency", "ms", 2, "per_request", "e2e_ns", "e2el"),
    Metric("tpot_ms", "TPOT", "TPOT (per request)", "ms", 2, "per_request", "tpot_ns", "tpot"),
    Metric("itl_ms", "ITL", "ITL (per token, pooled)", "ms", 2, "per_token_pooled", "itl"),
    Metric(
        "itl_chunk_ms", "ITL/chunk", "ITL (per chunk, pooled)", "ms", 2, "per_chunk_pooled", "itl"
    ),
)
RATES: tuple[Metric, ...] = (
    Metric(
        "output_throughput_tok_s",
        "Output throughput",
        "Output throughput",
        "tok/s",
        1,
        "per_run",
        "run",
        better="higher",
    ),
    Metric(
        "request_throughput_req_s",
        "Request throughput",
        "Request throughput",
        "req/s",
        2,
        "per_run",
        "run",
        better="higher",
    ),
    Metric("goodput_req_s", "Goodput", "Goodput", "req/s", 2, "per_run", "run", better="higher"),
    Metric(
        "input_throughput_tok_s",
        "Input throughput",
        "Input token throughput",
        "tok/s",
        1,
        "per_run",
        "run",
        better="higher",
    ),
    # a surface that generates no tokens: the items its answers carried a second (inputs
    # embedded, documents scored); a view names them by the run's endpoint (its ``items``)
    Metric(
        "items_per_s",
        "Items/s",
        "Items answered per second",
        "items/s",
        1,
        "per_run",
        "run",
        better="higher",
    ),
    Metric(
        "total_token_throughput_tok_s",
        "Total token throughput",
        "Total token throughput",
        "tok/s",
        1,
        "per_run",
        "run",
        better="higher",
    ),
)
METRICS: Mapping[str, Metric] = MappingProxyType({m.key: m for m in LATENCIES + RATES})
AGGREGATION: Mapping[str, Aggregation] = MappingProxyType({m.key: m.aggregation for m in LATENCIES})
# what a comparison of runs shows (app.services.compare), in its order
COMPARE_LATENCY_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms", "itl_ms")
COMPARE_RATE_KEYS = ("output_throughput_tok_s", "request_throughput_req_s", "goodput_req_s")
RELATIVE_DECIMALS = 1  # "+12.3%"


def metric(key: str) -> Metric:
    """The metric's definition; an unknown key is an error, not a raw key shown to a user."""
    try:
        return METRICS[key]
    except KeyError:
        raise KeyError(f"no metric {key!r} (app.analysis.metric_defs)") from None


def format_value(value: float | None, key: str, with_unit: bool = False) -> str:
    """``value`` with the metric's decimals and thousands separators (and its unit when
    ``with_unit``); an em dash for none."""
    if value is None or value != value:
        return "—"
    m = metric(key)
    text = f"{value:,.{m.decimals}f}"
    return f"{text} {m.unit}" if with_unit else text


def format_signed(value: float | None, key: str) -> str:
    """An absolute change in the metric's unit: ``+1.23 ms``."""
    if value is None or value != value:
        return "—"
    m = metric(key)
    return f"{value:+,.{m.decimals}f} {m.unit}"


def format_relative(rel: float | None) -> str:
    """A relative change (a fraction) as a signed percentage: ``+12.3%``."""
    if rel is None or rel != rel:
        return "—"
    return f"{rel * 100:+.{RELATIVE_DECIMALS}f}%"
