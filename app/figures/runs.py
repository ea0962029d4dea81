"""From a run's ``RunTrace`` to the arrays its plots show, vectorised with numpy.

Per-request latencies come from ``app.analysis`` (``per_request_metrics``); this module only
rearranges times for display (run-relative seconds, per-token gaps with their positions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from app.analysis.metric_defs import metric
from app.analysis.metrics import (
    NS_PER_MS,
    NS_PER_S,
    SUMMARY_ONLY_REASON,
    EventView,
    event_view,
    itl_samples,
    per_request_metrics,
    valid_requests,
)
from app.domain import PerRequestMetrics, RunTrace
from app.figures import common as fg
from app.figures.phases import phase_breakdown_figure

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

# metric key -> (title, PerRequestMetrics attribute or "itl"): the distribution figures
DIST_KEYS = ("ttft_ms", "ttfot_ms", "tpot_ms", "itl_ms", "e2el_ms")
DIST_PLOTS: dict[str, tuple[str, str]] = {k: (metric(k).title, metric(k).source) for k in DIST_KEYS}
DIST_AXES = {k: metric(k).label for k in DIST_KEYS}


@dataclass(frozen=True, slots=True)
class RunPlots:
    """Every figure of the run page, keyed by a DOM-friendly id."""

    figures: dict[str, dict[str, Any]]


def _seconds(t_ns: I64) -> F64:
    out = np.where(t_ns >= 0, t_ns / NS_PER_S, np.nan)
    return out.astype(np.float64)


def itl_by_position(trace: RunTrace, tokens: EventView | None = None) -> tuple[F64, F64]:
    """(token position, per-token ITL in ms) for every token-bearing chunk after the first
    of each successful request. A chunk of k tokens after a gap g gives one point g/k at the
    position of its last token (the per-token ITL definition, shown per chunk)."""
    tv = tokens if tokens is not None else event_view(trace)
    if trace.summary_only or tv.size == 0:
        return np.zeros(0), np.zeros(0)
    valid = valid_requests(trace)
    counts = tv.counts
    firsts = tv.first_positions()
    keep = tv.request_mask(valid)
    keep[firsts] = False
    # in place where it can be: a run of 10M events holds a few arrays of 10M, not a dozen
    gaps = np.empty(tv.size, np.float64)
    gaps[0] = np.nan
    np.subtract(tv.t_ns[1:], tv.t_ns[:-1], out=gaps[1:])  # int64 gaps, stored as float64
    itl = gaps[keep]
    del gaps
    itl /= tv.tokens[keep]
    itl /= NS_PER_MS
    position = np.cumsum(tv.tokens, dtype=np.int64)
    before = np.zeros(counts.shape[0], np.int64)
    has = counts > 0
    before[has] = position[tv.offsets[:-1][has]] - tv.tokens[tv.offsets[:-1][has]]
    position -= np.repeat(before, counts)
    kept = position[keep]
    del position
    return kept.astype(np.float64), itl


def dist_samples(
    key: str, trace: RunTrace, prm: PerRequestMetrics, tokens: EventView
) -> tuple[F64, str]:
    """The samples (ms) behind a distribution key and the reason when there are none."""
    attr = DIST_PLOTS[key][1]
    if attr == "itl":
        if trace.summary_only:
            return np.zeros(0), "no per-token data (" + SUMMARY_ONLY_REASON + ")"
        s = itl_samples(trace, tokens)
        per = s.per_token if s.per_token is not None else s.per_chunk().astype(np.float64)
        return per / NS_PER_MS, "no successful request with two tokens"
    arr: F64 = getattr(prm, attr) / NS_PER_MS
    reason = "no successful request" if key != "tpot_ms" else "no request with 2+ tokens"
    return arr, reason


def run_figures(
    trace: RunTrace,
    *,
    scheduled_ns: I64 | None = None,
    sent_sched_ns: I64 | None = None,
    indexes: I64 | None = None,
) -> RunPlots:
    """All run-page figures. ``scheduled_ns`` / ``sent_sched_ns`` (aligned with the trace)
    feed the send-lag plot; ``indexes`` are the requests' stored indexes for click-through."""
    tokens = event_view(trace)
    prm = per_request_metrics(trace)
    figs: dict[str, dict[str, Any]] = {}
    for key, (title, _attr) in DIST_PLOTS.items():
        samples, reason = dist_samples(key, trace, prm, tokens)
        name = key.removesuffix("_ms")
        xtitle = f"{DIST_AXES[key]} (ms)"
        figs[f"cdf_{name}"] = fg.cdf_figure(
            samples, title=f"{title}: CDF", xtitle=xtitle, no_data_reason=reason
        )
        figs[f"hist_{name}"] = fg.histogram_figure(
            samples, title=f"{title}: histogram", xtitle=xtitle, no_data_reason=reason
        )
    idx = indexes if indexes is not None else np.arange(trace.n_requests, dtype=np.int64)
    first = tokens.first_t()
    last = tokens.last_t()
    figs["timeline"] = fg.timeline_figure(
        _seconds(trace.sent_ns),
        _seconds(first),
        _seconds(last),
        _seconds(trace.end_ns),
        [str(s) for s in trace.status],
        idx,
    )
    valid = valid_requests(trace)
    ev_keep = tokens.request_mask(valid)
    figs["throughput"] = fg.throughput_figure(
        tokens.t_ns[ev_keep] / NS_PER_S,
        tokens.tokens[ev_keep],
        _seconds(trace.sent_ns),
        _seconds(trace.end_ns),
    )
    if trace.summary_only:
        figs["itl_position"] = fg.empty_figure(
            "ITL against token position", "no per-token data (summary-only run)"
        )
    else:
        figs["itl_position"] = fg.itl_position_figure(*itl_by_position(trace, tokens))
    figs["ttft_input"] = fg.ttft_input_figure(trace.input_tokens, prm.ttft_ns / NS_PER_MS)
    figs["phases"] = phase_breakdown_figure(trace, idx)
    if scheduled_ns is not None and sent_sched_ns is not None and scheduled_ns.size:
        sent_ok = sent_sched_ns >= 0
        lag = np.where(sent_ok, (sent_sched_ns - scheduled_ns) / NS_PER_MS, np.nan)
        figs["send_lag"] = fg.send_lag_figure(scheduled_ns / NS_PER_S, lag)
    else:
        figs["send_lag"] = fg.empty_figure(
            "Send lag against schedule", "this run has no schedule (imported or empty)"
        )
    return RunPlots(figures=figs)
