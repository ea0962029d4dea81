"""Human names, units and display decimals of the metrics a comparison shows: the one table
the compare page, its figures and the comparison service read (never a raw key such as
``output_throughput_tok_s`` on a page).

Decimals are one rule per unit, the same in every cell of a column: latencies in ms with 2
decimals (sub-millisecond ITL/TPOT differences stay visible), token rates with 1, request
rates with 2; relative changes as a signed percentage with 1 decimal."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class MetricLabel:
    label: str  # "TTFT"
    unit: str  # "ms", "tok/s", "req/s"
    decimals: int  # digits after the point wherever the value is shown

    @property
    def heading(self) -> str:
        """``TTFT (ms)``: the label with its unit."""
        return f"{self.label} ({self.unit})"


LATENCY_KEYS = ("ttft_ms", "tpot_ms", "e2el_ms", "itl_ms")
RATE_KEYS = ("output_throughput_tok_s", "request_throughput_req_s", "goodput_req_s")

METRIC_LABELS: Mapping[str, MetricLabel] = MappingProxyType(
    {
        "ttft_ms": MetricLabel("TTFT", "ms", 2),
        "tpot_ms": MetricLabel("TPOT", "ms", 2),
        "e2el_ms": MetricLabel("E2E latency", "ms", 2),
        "itl_ms": MetricLabel("ITL (per token, pooled)", "ms", 2),
        "output_throughput_tok_s": MetricLabel("Output throughput", "tok/s", 1),
        "request_throughput_req_s": MetricLabel("Request throughput", "req/s", 2),
        "goodput_req_s": MetricLabel("Goodput", "req/s", 2),
    }
)
RELATIVE_DECIMALS = 1  # "+12.3%"


def label_of(key: str) -> MetricLabel:
    """The metric's label; an unknown key is an error, not a raw key shown to a user."""
    try:
        return METRIC_LABELS[key]
    except KeyError:
        raise KeyError(f"no label for metric {key!r} (app.analysis.metric_labels)") from None


def format_value(value: float | None, key: str, with_unit: bool = False) -> str:
    """``value`` with the metric's decimals and thousands separators (and its unit when
    ``with_unit``); an em dash for none."""
    if value is None or value != value:
        return "—"
    m = label_of(key)
    text = f"{value:,.{m.decimals}f}"
    return f"{text} {m.unit}" if with_unit else text


def format_signed(value: float | None, key: str) -> str:
    """An absolute change in the metric's unit: ``+1.23 ms``."""
    if value is None or value != value:
        return "—"
    m = label_of(key)
    return f"{value:+,.{m.decimals}f} {m.unit}"


def format_relative(rel: float | None) -> str:
    """A relative change (a fraction) as a signed percentage: ``+12.3%``."""
    if rel is None or rel != rel:
        return "—"
    return f"{rel * 100:+.{RELATIVE_DECIMALS}f}%"
