"""From a run's ``RunTrace`` to the arrays its plots show, vectorised with numpy.

Per-request latencies come from ``app.analysis`` (the registry's metrics, over one
``RunBasis``); this module only rearranges times for display (run-relative seconds,
per-token gaps with their positions). The distribution figures are those of the metrics
the registry shows there (``Metric.views`` "figures").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from app.analysis.answers import NO_TOKENS, has_answers
from app.analysis.metric_defs import TTFT, Metric, RunBasis, shown
from app.analysis.metrics import (
    EVENT_BLOCK,
    NS_PER_MS,
    NS_PER_S,
    SUMMARY_ONLY_REASON,
    EventView,
    basis,
    event_requests,
    event_view,
    valid_requests,
)
from app.domain import RunTrace
from app.figures import common as fg
from app.figures.phases import phase_breakdown_figure, wait_figures

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
IPos = npt.NDArray[np.int32] | npt.NDArray[np.int64]
STEADY_SHADED = ("timeline", "throughput")  # the time charts the steady window is shaded on
POSITION_SORT_LIMIT = 1 << 24  # longest answer (tokens) whose positions are counted, not sorted


@dataclass(frozen=True, slots=True)
class RunPlots:
    """Every figure of the run page, keyed by a DOM-friendly id."""

    figures: dict[str, dict[str, Any]]


def _seconds(t_ns: I64) -> F64:
    out = np.where(t_ns >= 0, t_ns / NS_PER_S, np.nan)
    return out.astype(np.float64)


def itl_by_position(trace: RunTrace, tokens: EventView | None = None) -> tuple[IPos, F64]:
    """(token position, per-token ITL in ms) for every token-bearing chunk after the first
    of each successful request, sorted by position (ties in event order). A chunk of k
    tokens after a gap g gives one point g/k at the position of its last token (the
    per-token ITL definition, shown per chunk).

    Built in blocks of events and placed by a counting sort on the position, so a run of
    10M chunks holds the two sorted arrays (int32 positions) and one block, not a dozen
    full-size temporaries."""
    tv = tokens if tokens is not None else event_view(trace)
    if trace.summary_only or tv.size == 0:
        return np.zeros(0, np.int32), np.zeros(0)
    valid = valid_requests(trace)
    sums = tv.token_sum()
    top = int(sums.max())
    before = np.zeros(sums.shape[0], np.int64)  # tokens of the events before each request
    np.cumsum(sums[:-1], out=before[1:])
    starts = np.arange(0, tv.size, EVENT_BLOCK)
    carry = np.zeros(starts.shape[0], np.int64)  # tokens of the events before each block
    np.cumsum(np.add.reduceat(tv.tokens, starts, dtype=np.int64)[:-1], out=carry[1:])
    blocks = [
        (int(a), min(int(a) + EVENT_BLOCK, tv.size), int(c))
        for a, c in zip(starts, carry, strict=True)
    ]
    if top >= POSITION_SORT_LIMIT:  # a position range too wide to count: sort instead
        pos, itl = _itl_points(tv, valid, before, 0, tv.size, 0)
        order = np.argsort(pos, kind="stable")
        return pos[order], itl[order]
    per_pos = np.zeros(top + 1, np.int64)
    for a, b, c in blocks:
        pos, _ = _itl_points(tv, valid, before, a, b, c, with_itl=False)
        per_pos += np.bincount(pos, minlength=top + 1)
    fill = np.cumsum(per_pos) - per_pos  # where each position's points start
    out_pos = np.empty(int(per_pos.sum()), np.int32)
    out_itl = np.empty(out_pos.shape[0], np.float64)
    for a, b, c in blocks:
        pos, itl = _itl_points(tv, valid, before, a, b, c)
        order = np.argsort(pos, kind="stable")
        pos = pos[order]
        here = np.bincount(pos, minlength=top + 1)
        dest = fill[pos] + (np.arange(pos.shape[0]) - (np.cumsum(here) - here)[pos])
        out_pos[dest] = pos
        out_itl[dest] = itl[order]
        fill += here
    return out_pos, out_itl


def _itl_points(
    tv: EventView,
    valid: npt.NDArray[np.bool_],
    before: I64,
    a: int,
    b: int,
    carry: int,
    *,
    with_itl: bool = True,
) -> tuple[I64, F64]:
    """``itl_by_position``'s points from events ``a .. b - 1`` (``carry``: the tokens of
    the events before ``a``; ``before``: of the events before each request), in event
    order; without ``with_itl`` only the positions."""
    req = event_requests(tv, a, b)
    # a point per chunk of a valid request that is not the request's first chunk
    keep = valid[req] & (np.arange(a, b) != tv.offsets[req])
    position = np.cumsum(tv.tokens[a:b], dtype=np.int64)
    position += carry
    position -= before[req]  # the token's position within its request's answer
    del req
    pos = position[keep]
    if not with_itl:
        return pos, np.zeros(0)
    lo = max(a, 1)
    gaps = np.full(b - a, np.nan)
    np.subtract(tv.t_ns[lo:b], tv.t_ns[lo - 1 : b - 1], out=gaps[lo - a :])  # exact int64 gaps
    itl = gaps[keep]
    del gaps
    itl /= tv.tokens[a:b][keep]
    itl /= NS_PER_MS
    return pos, itl


def dist_samples(m: Metric, b: RunBasis) -> tuple[F64, str]:
    """The samples (in the metric's unit) behind a metric's distribution figures and the
    reason when there are none."""
    if not m.answers and b.tokens.size == 0 and has_answers(b.trace):  # embeddings, rerank
        return np.zeros(0), NO_TOKENS
    if m.samples is not None:  # pooled samples
        if b.trace.summary_only:
            return np.zeros(0), "no per-token data (" + SUMMARY_ONLY_REASON + ")"
        return m.samples(b), m.empty
    values = b.value(m.key)
    if values is None:
        return np.zeros(0), m.no_data
    arr: F64 = values / m.per_unit
    return arr, m.empty


def run_figures(
    trace: RunTrace,
    *,
    scheduled_ns: I64 | None = None,
    turns: I64 | None = None,
    indexes: I64 | None = None,
    steady_ns: tuple[int, int] | None = None,
) -> RunPlots:
    """All run-page figures. ``scheduled_ns`` and ``turns`` (aligned with the trace; turn
    -1 for a single request) feed the send-lag and queue-wait plots; ``indexes`` are the
    requests' stored indexes for click-through; ``steady_ns``: the run's steady window
    (``analysis.steady``), shaded on the time charts (timeline, throughput)."""
    b = basis(trace)
    tokens = b.tokens
    figs: dict[str, dict[str, Any]] = {}
    for m in shown("figures"):
        samples, reason = dist_samples(m, b)
        name = m.short_key
        figs[f"cdf_{name}"], figs[f"hist_{name}"] = fg.distribution_figures(
            samples, title=m.title, xtitle=m.heading, no_data_reason=reason
        )
        del samples  # (10M ITL samples) before the next figure's arrays
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
    if bool(ev_keep.all()):  # no gathered copies of every event when all count
        t_s, counts = tokens.t_ns / NS_PER_S, tokens.tokens
    else:
        t_s, counts = tokens.t_ns[ev_keep] / NS_PER_S, tokens.tokens[ev_keep]
    del ev_keep
    figs["throughput"] = fg.throughput_figure(
        t_s, counts, _seconds(trace.sent_ns), _seconds(trace.end_ns)
    )
    del t_s, counts
    if trace.summary_only:
        figs["itl_position"] = fg.empty_figure(
            "ITL against token position", "no per-token data (summary-only run)"
        )
    else:
        pos, itl = itl_by_position(trace, tokens)
        figs["itl_position"] = fg.itl_position_figure(pos, itl, sorted_by_position=True)
        del pos, itl
    ttft = b.value(TTFT.key)
    assert ttft is not None  # TTFT needs no more than the events
    figs["ttft_input"] = fg.ttft_input_figure(trace.input_tokens, ttft / TTFT.per_unit)
    figs["phases"] = phase_breakdown_figure(trace, idx)
    figs["send_lag"], figs["queue_wait"] = wait_figures(trace, scheduled_ns, turns)
    if steady_ns is not None:
        for key in STEADY_SHADED:
            fg.shade_window(figs[key], steady_ns[0] / NS_PER_S, steady_ns[1] / NS_PER_S, "steady")
    return RunPlots(figures=figs)
