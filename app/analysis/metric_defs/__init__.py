"""Every metric tokentrace reports, defined once, one module each (``Metric``, in
``base``): its report key, names, unit, display decimals, what one sample is, how it is
computed (vectorised over the run's columns), where its per-request values are stored, the
views that show it, its name in the definition profiles, its goodput SLO and the surfaces
it applies to. The report (``app.analysis.metrics``), the CLI, the run page and its
figures, the live panel, the requests table, the exports, comparisons, sweeps, series and
their gates loop over ``METRICS``; a view that means one metric (a diagnosis rule about
TTFT) names its object (``TTFT``), never its key. ``docs/metrics.md`` says how each is
measured and how to add one: its module here, its line in ``METRICS``, its test and its
docs line.

Decimals are one rule per unit, the same in every cell of a column: latencies in ms with 2
decimals (sub-millisecond ITL/TPOT differences stay visible), token rates with 1, request
rates with 2; relative changes as a signed percentage with 1 decimal."""

from __future__ import annotations

from collections.abc import Mapping

from .base import AGG_TEXT, Metric, RunBasis, RunTotals, View
from .e2el import E2EL
from .goodput import GOODPUT
from .input_throughput import INPUT_THROUGHPUT
from .items_per_s import ITEMS_PER_S
from .itl import ITL
from .itl_chunk import ITL_CHUNK
from .output_throughput import OUTPUT_THROUGHPUT
from .request_throughput import REQUEST_THROUGHPUT
from .total_token_throughput import TOTAL_TOKEN_THROUGHPUT
from .tpot import TPOT
from .ttfot import TTFOT
from .ttft import TTFT
from .ttftc import TTFTC
from .user_ttft import USER_TTFT

__all__ = [
    "AGG_TEXT",
    "E2EL",
    "GOODPUT",
    "INPUT_THROUGHPUT",
    "ITEMS_PER_S",
    "ITL",
    "ITL_CHUNK",
    "METRICS",
    "OUTPUT_THROUGHPUT",
    "REQUEST_THROUGHPUT",
    "TOTAL_TOKEN_THROUGHPUT",
    "TPOT",
    "TTFOT",
    "TTFT",
    "TTFTC",
    "USER_TTFT",
    "Metric",
    "RunBasis",
    "RunTotals",
    "View",
]

# every metric by key, in the order every view shows them (a view shows those it shows)
METRICS: dict[str, Metric] = {
    m.key: m
    for m in (
        TTFT,
        USER_TTFT,
        TTFOT,
        TTFTC,
        TPOT,
        ITL,
        ITL_CHUNK,
        E2EL,
        REQUEST_THROUGHPUT,
        OUTPUT_THROUGHPUT,
        TOTAL_TOKEN_THROUGHPUT,
        GOODPUT,
        INPUT_THROUGHPUT,
        ITEMS_PER_S,
    )
}
RELATIVE_DECIMALS = 1  # "+12.3%"


def metric(key: str) -> Metric:
    """The metric's definition; an unknown key is an error, not a raw key shown to a user."""
    try:
        return METRICS[key]
    except KeyError:
        raise KeyError(f"no metric {key!r} (app.analysis.metric_defs)") from None


def latencies() -> list[Metric]:
    """The distributions (per request or pooled samples), in order."""
    return [m for m in METRICS.values() if m.aggregation != "per_run"]


def rates() -> list[Metric]:
    """The one-number-per-run metrics (throughputs), in order."""
    return [m for m in METRICS.values() if m.aggregation == "per_run"]


def per_request() -> list[Metric]:
    """The metrics with one value per request (the exports' and the request page's)."""
    return [m for m in METRICS.values() if m.aggregation == "per_request"]


def shown(view: View, endpoint: str | None = None, stream: bool | None = None) -> list[Metric]:
    """The metrics ``view`` shows, in order; with a run's ``endpoint`` and ``stream``, only
    those that apply to it."""
    return [m for m in METRICS.values() if view in m.views and m.applies(endpoint, stream)]


def applies_to(m: Metric, spec: Mapping[str, object] | None) -> bool:
    """Whether ``m`` applies to a run of ``spec`` (a report's or run's spec dict: its
    ``endpoint`` and ``stream``; an import's says neither, and every metric applies)."""
    spec = spec or {}
    endpoint, stream = spec.get("endpoint"), spec.get("stream")
    return m.applies(
        endpoint if isinstance(endpoint, str) else None,
        stream if isinstance(stream, bool) else None,
    )


def slo_metrics() -> dict[str, Metric]:
    """SLO name -> the metric it bounds ("ttft" -> TTFT), in order."""
    return {m.slo: m for m in METRICS.values() if m.slo is not None}


def headline_key(m: Metric, stat: str) -> str:
    """A headline figure's key in a run row's cached summary: "ttft_ms_p50" for TTFT's
    p50, the metric's key for a per-run value ("value")."""
    return m.key if stat == "value" else f"{m.key}_{stat}"


def headline_cells() -> list[tuple[Metric, str, str]]:
    """(metric, statistic, its key in a run row's cached summary) of each figure a listing
    shows: "ttft_ms_p50" for TTFT's p50, the metric's key for a per-run value."""
    return [(m, stat, headline_key(m, stat)) for m in METRICS.values() for stat in m.headline]


def headline_heading(m: Metric, stat: str) -> str:
    """A listing's column heading: "TTFT p50 (ms)", "Goodput (req/s)"."""
    return m.heading if stat == "value" else f"{m.label} {stat} ({m.unit})"


def by_column(name: str) -> Metric:
    """The metric whose column a view names ``name`` ("ttft" for ``ttft_ns``)."""
    for m in METRICS.values():
        if m.column is not None and m.column_name == name:
            return m
    raise KeyError(f"no metric with the column {name!r}")


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
