"""tokentrace's own metrics (SPEC §1-2), computed from a ``RunTrace`` with numpy only: every
metric of the registry (``app.analysis.metric_defs``, one module each, which says how it is
computed), the request counts and the window (``run_counts``), goodput (``goodput``).

Vectorised over events through ``RunTrace.ev_offsets`` (``event_views``): no Python loop per
event or request.

* token-bearing event: kind CONTENT or REASONING with ``ev_tokens > 0``;
* n = ``output_tokens`` when known (>= 0), else the sum of ``ev_tokens`` over token events;
* failed requests: NaN everywhere; ok requests without token events: NaN latencies.

Two aggregations, never mixed: per request (TTFT, TTFOT, E2E, TPOT: one sample per
successful request) and pooled (ITL per token; ITL per chunk).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from app.domain import PerRequestMetrics, RunTrace

from .answers import NO_TOKENS, items_answered
from .event_views import (
    EVENT_BLOCK,
    NS_PER_MS,
    NS_PER_S,
    SUMMARY_ONLY_REASON,
    EventView,
    ItlSamples,
    event_requests,
    event_view,
    itl_samples,
    itl_samples_ms,
    output_token_counts,
    valid_requests,
)
from .goodput import check_slos, slo_goodput
from .metric_defs import METRICS, RunBasis, RunTotals, latencies, per_request, rates
from .percentiles import Distribution
from .phases import phase_summary
from .run_counts import Counts, Window, count_requests, default_window, resolve_window

# the event views and the run's counts, as the readers of the metrics import them
__all__ = [
    "EVENT_BLOCK",
    "NS_PER_MS",
    "NS_PER_S",
    "SUMMARY_ONLY_REASON",
    "Counts",
    "EventView",
    "ItlSamples",
    "RunMetrics",
    "Window",
    "basis",
    "compute_metrics",
    "count_requests",
    "default_window",
    "event_requests",
    "event_view",
    "itl_samples",
    "itl_samples_ms",
    "metrics_with_slos",
    "output_token_counts",
    "per_request_metrics",
    "per_request_of",
    "per_request_values",
    "resolve_window",
    "valid_requests",
]

F64 = npt.NDArray[np.float64]
BoolArr = npt.NDArray[np.bool_]


def basis(trace: RunTrace, *, ci: bool = True, seed: int = 0) -> RunBasis:
    """What the registry's metrics are computed from, for ``trace``."""
    return RunBasis(trace, METRICS, ci=ci, seed=seed)


def per_request_values(b: RunBasis) -> dict[str, F64]:
    """Every per-request metric's values (base unit, ns), by key; those the run did not
    record (user-perceived TTFT without connection phases) left out."""
    out: dict[str, F64] = {}
    for m in per_request():
        v = b.value(m.key)
        if v is not None:
            out[m.key] = v
    return out


def per_request_of(b: RunBasis) -> PerRequestMetrics:
    """The stored per-request values: each stored metric's in its column (``Metric.column``)
    or, without one, in ``extra`` (``requests.metric_values``), and the output tokens."""
    columns: dict[str, Any] = {}
    extra: dict[str, F64] = {}
    for m in per_request():
        if not m.stored:
            continue
        v = b.value(m.key)
        if m.column is not None:
            columns[m.column] = v if v is not None else np.full(b.trace.n_requests, np.nan)
        elif v is not None:
            extra[m.key] = v
    return PerRequestMetrics(**columns, n_tokens=b.n_tokens.astype(np.int64), extra=extra)


def per_request_metrics(trace: RunTrace) -> PerRequestMetrics:
    """Per-request TTFT, TTFOT, E2E and TPOT in ns (NaN where undefined), aligned with
    ``trace``, and the other stored metrics' values (``per_request_of``)."""
    return per_request_of(basis(trace))


@dataclass(frozen=True, slots=True)
class RunMetrics:
    """Everything tokentrace reports for one run. Distributions are in ms."""

    counts: Counts
    window: Window | None
    input_tokens_total: int
    output_tokens_total: int
    rates: dict[str, float | None]  # each per-run metric (a throughput) by key
    items_total: int | None  # the items the answers carried (embeddings, rerank), else None
    slos_ms: dict[str, float]
    good_requests: int | None
    distributions: dict[str, Distribution]
    summary_only: bool
    itl_no_data_reason: str | None = None
    e2e_end: str = "last_token"
    notes: list[str] = field(default_factory=list)
    phases: dict[str, object] = field(default_factory=dict)

    def dist(self, key: str) -> Distribution:
        """A distribution by its metric's key."""
        return self.distributions[key]

    def rate(self, key: str) -> float | None:
        """A per-run metric by its key (None without a window, or goodput without SLOs)."""
        return self.rates[key]

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "requests": self.counts.to_dict(),
            "error_rate": self.counts.error_rate,
            "window": None if self.window is None else self.window.to_dict(),
            "input_tokens_total": self.input_tokens_total,
            "output_tokens_total": self.output_tokens_total,
            "items_total": self.items_total,
            **self.rates,
            "slos_ms": dict(self.slos_ms),
            "good_requests": self.good_requests,
            "summary_only": self.summary_only,
            "itl_no_data_reason": self.itl_no_data_reason,
            "e2e_end": self.e2e_end,
            "aggregation": {key: METRICS[key].aggregation for key in self.distributions},
            "notes": list(self.notes),
            "phases": dict(self.phases),
        }
        for key, dist in self.distributions.items():
            out[key] = dist.to_dict()
        return out


def _window_of(w: object) -> Window | None:
    if not isinstance(w, dict):
        return None
    return Window(start_ns=int(w["start_ns"]), end_ns=int(w["end_ns"]), source=w["source"])


def metrics_with_slos(
    base: dict[str, object],
    values: Mapping[str, F64],
    ok: BoolArr,
    slos_ms: dict[str, float] | None,
) -> dict[str, object]:
    """``compute_metrics(trace, slos_ms=slos_ms).to_dict()`` from ``base``, the same run's
    ``compute_metrics(trace, slos_ms={}).to_dict()``, and its per-request values
    (``values``: ``per_request_values``; ``ok`` = ``valid_requests``): only the SLO fields
    and the per-run metrics that use the SLOs depend on them, and they need no event."""
    slos = check_slos(slos_ms)
    n_good, notes = slo_goodput(values, ok, slos)
    req = base.get("requests")
    totals = RunTotals(
        window=_window_of(base.get("window")),
        ok=int(req.get("completed_ok") or 0) if isinstance(req, dict) else 0,
        input_tokens=int(base.get("input_tokens_total") or 0),  # type: ignore[call-overload]
        output_tokens=int(base.get("output_tokens_total") or 0),  # type: ignore[call-overload]
        good=n_good,
        items=items if isinstance(items := base.get("items_total"), int) else None,
    )
    base_notes = base.get("notes")
    out = dict(base)
    out["slos_ms"] = dict(slos)
    out["good_requests"] = n_good
    for m in rates():
        if m.uses_slos and m.per_run is not None:
            out[m.key] = m.per_run(totals)
    out["notes"] = notes + (list(base_notes) if isinstance(base_notes, list) else [])
    return out


def compute_metrics(
    trace: RunTrace,
    *,
    window_ns: tuple[int, int] | None = None,
    slos_ms: dict[str, float] | None = None,
    ci: bool = True,
    seed: int = 0,
) -> RunMetrics:
    """All of tokentrace's metrics for ``trace``.

    ``window_ns`` (run-relative start, end) only sets the throughput denominator; requests are
    not filtered by it. ``slos_ms``: SLO name ("ttft", "tpot", "e2el", "user_ttft": the
    registry's ``Metric.slo``) -> ms; goodput is ``None`` without SLOs.
    """
    slos = check_slos(slos_ms)
    b = basis(trace, ci=ci, seed=seed)
    counts = count_requests(trace)
    window = resolve_window(trace, window_ns)
    ok = b.valid
    out_tokens = int(np.clip(b.n_tokens[ok], 0, None).sum())
    in_tokens = int(np.clip(trace.input_tokens[ok], 0, None).sum())
    values = per_request_values(b)
    items = items_answered(trace, ok)
    # a surface that answers once (no generated tokens): the token metrics do not apply
    answers_only = items is not None and b.tokens.size == 0
    dists = {
        m.key: Distribution.no_data(NO_TOKENS)
        if answers_only and not m.answers
        else b.distribution(m.key)
        for m in latencies()
    }
    b.forget_samples()
    n_good, notes = slo_goodput(values, ok, slos)
    if counts.ok and bool(np.any(trace.input_tokens[ok] < 0)):
        notes.append(
            "some successful requests have no input token count: total throughput omits them"
        )
    totals = RunTotals(window, counts.ok, in_tokens, out_tokens, n_good, items)
    no_data_reason = SUMMARY_ONLY_REASON if trace.summary_only else None
    return RunMetrics(
        counts=counts,
        window=window,
        input_tokens_total=in_tokens,
        output_tokens_total=out_tokens,
        items_total=items,
        rates={
            m.key: None if answers_only and not m.answers else m.per_run(totals)
            for m in rates()
            if m.per_run is not None
        },
        slos_ms=slos,
        good_requests=n_good,
        distributions=dists,
        summary_only=trace.summary_only,
        itl_no_data_reason=NO_TOKENS if answers_only else no_data_reason,
        e2e_end="answer" if answers_only else "last_token",
        notes=notes,
        phases=phase_summary(trace, ok),
    )
