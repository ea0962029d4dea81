"""The columnar trace's events grouped per request, and the samples built from them (SPEC
§1): the token-bearing events (``event_view``), which requests are latency samples
(``valid_requests``), a time since the request was sent (``since_sent``), the output token
count per request (``output_token_counts``) and the pooled ITL samples (``itl_samples``).

Vectorised over events through ``RunTrace.ev_offsets``: no Python loop per event or request.
The metrics themselves (``app.analysis.metric_defs``) are computed from these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.domain import TOKEN_KINDS, EventKind, RunTrace

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
BoolArr = npt.NDArray[np.bool_]

NS_PER_MS = 1e6
NS_PER_S = 1e9
SUMMARY_ONLY_REASON = "summary-only run (imported log): no per-token arrival times"


# --------------------------------------------------------------------------- event views


@dataclass(frozen=True, slots=True)
class EventView:
    """The events of a chosen kind set, grouped per request.

    ``t_ns`` / ``tokens`` hold the selected events in order; request i owns positions
    ``offsets[i]:offsets[i+1]``.
    """

    offsets: I64
    t_ns: I64
    tokens: I32

    @property
    def size(self) -> int:
        return int(self.t_ns.shape[0])

    @property
    def counts(self) -> I64:
        out: I64 = np.diff(self.offsets)
        return out

    @property
    def has_any(self) -> BoolArr:
        out: BoolArr = self.offsets[1:] > self.offsets[:-1]
        return out

    def first_t(self) -> I64:
        """First event time per request (-1 where the request has none)."""
        return self.nth_t(0)

    def last_t(self) -> I64:
        """Last event time per request (-1 where the request has none)."""
        out = np.full(self.offsets.shape[0] - 1, -1, np.int64)
        has = self.has_any
        out[has] = self.t_ns[self.offsets[1:][has] - 1]
        return out

    def nth_t(self, k: int) -> I64:
        """k-th (0-based) event time per request (-1 where it has fewer than k+1)."""
        out = np.full(self.offsets.shape[0] - 1, -1, np.int64)
        ok = self.counts > k
        out[ok] = self.t_ns[self.offsets[:-1][ok] + k]
        return out

    def token_sum(self, which: BoolArr | None = None) -> I64:
        """Sum of ``tokens`` per request (0 without events); only ``which`` requests if given."""
        sel = self.has_any if which is None else self.has_any & which
        out = np.zeros(self.offsets.shape[0] - 1, np.int64)
        starts = self.offsets[:-1][sel]
        if starts.size == 0:
            return out
        # reduceat sums starts[j]..starts[j+1]; requests in between have no events, and the
        # last range runs to the end, so trim the array at the last selected request's end.
        end = int(self.offsets[1:][sel][-1])
        out[sel] = np.add.reduceat(self.tokens[:end], starts, dtype=np.int64)
        return out

    def first_positions(self) -> I64:
        """Positions (in this view) of each request's first event, for requests with any."""
        out: I64 = self.offsets[:-1][self.has_any]
        return out

    def request_mask(self, per_request: BoolArr) -> BoolArr:
        """Broadcast a per-request boolean to the selected events."""
        out: BoolArr = np.repeat(per_request, self.counts)
        return out


def event_view(
    trace: RunTrace,
    kinds: Sequence[EventKind] = TOKEN_KINDS,
    *,
    require_tokens: bool = True,
) -> EventView:
    """Select events whose kind is in ``kinds`` (and, by default, carry > 0 tokens)."""
    mask = _kind_mask(trace, kinds)
    if require_tokens:
        mask &= trace.ev_tokens > 0
    if bool(mask.all()):  # common case: every event is selected, skip the gathers
        return EventView(
            offsets=trace.ev_offsets.astype(np.int64, copy=False),
            t_ns=trace.ev_t_ns,
            tokens=trace.ev_tokens,
        )
    idx = np.flatnonzero(mask)
    offsets = np.searchsorted(idx, trace.ev_offsets).astype(np.int64, copy=False)
    return EventView(offsets=offsets, t_ns=trace.ev_t_ns[idx], tokens=trace.ev_tokens[idx])


def _kind_mask(trace: RunTrace, kinds: Sequence[EventKind]) -> BoolArr:
    values = sorted({int(k) for k in kinds})
    if values == [int(EventKind.CONTENT), int(EventKind.REASONING), int(EventKind.TOOL_CALL)]:
        # two comparisons instead of isin
        out: BoolArr = (trace.ev_kind <= EventKind.REASONING) | (
            trace.ev_kind == EventKind.TOOL_CALL
        )
        return out
    if values == [int(EventKind.CONTENT), int(EventKind.REASONING)]:
        out = trace.ev_kind <= EventKind.REASONING  # one comparison instead of isin
        return out
    if len(values) == 1:
        out = trace.ev_kind == values[0]
        return out
    out = np.isin(trace.ev_kind, values)
    return out


def content_view(trace: RunTrace, tokens: EventView) -> EventView:
    """Token-bearing output events (content and tool-call deltas: reasoning left out); the
    token view itself when the run has no reasoning."""
    if not bool(np.any(trace.ev_kind == EventKind.REASONING)):
        return tokens
    return event_view(trace, (EventKind.CONTENT, EventKind.TOOL_CALL))


def valid_requests(trace: RunTrace) -> BoolArr:
    """Requests that can be latency samples: status ok and actually sent."""
    out: BoolArr = trace.ok & (trace.sent_ns >= 0)
    return out


def since_sent(t_ns: I64, trace: RunTrace, valid: BoolArr) -> F64:
    """``t - sent`` in ns as float, NaN where not ``valid`` (or ``t`` unknown)."""
    ok = valid & (t_ns >= 0)
    out = np.full(t_ns.shape[0], np.nan)
    out[ok] = (t_ns[ok] - trace.sent_ns[ok]).astype(np.float64)
    return out


def output_token_counts(trace: RunTrace, tokens: EventView) -> I64:
    """n per request: ``trace.output_tokens`` when >= 0, else the token events' sum."""
    unknown = trace.output_tokens < 0
    if not bool(unknown.any()):
        return trace.output_tokens.astype(np.int64, copy=True)
    out: I64 = np.where(unknown, tokens.token_sum(unknown), trace.output_tokens)
    return out


# --------------------------------------------------------------------------- ITL samples


@dataclass(frozen=True, slots=True)
class ItlSamples:
    """Pooled ITL samples (ns) over successful requests.

    ``per_token``: a chunk j >= 2 carrying k tokens, arriving g after the previous
    token-bearing chunk, gives k samples g/k; a request's first chunk carrying k1 tokens
    gives k1 - 1 samples of 0. So a request contributes (sum of its chunk tokens) - 1
    samples whose mean is its (t_last - t_first) / (tokens - 1). A request whose tokens all
    came in one chunk (a non-streamed answer) gives none, as it has no TPOT.
    ``per_chunk``: one sample per consecutive pair of token-bearing chunks of a request:
    ``chunk_gaps`` minus the positions ``chunk_exclude`` (gaps that cross from one request
    to the next, or belong to failed requests); kept this way to avoid a filtered copy.
    ``per_token is None``: every chunk carried one token, so per-token = per-chunk samples.
    """

    chunk_gaps: I64
    chunk_exclude: I64
    per_token: F64 | None

    def per_chunk(self) -> I64:
        keep = np.ones(self.chunk_gaps.shape[0], np.bool_)
        keep[self.chunk_exclude] = False
        out: I64 = self.chunk_gaps[keep]
        return out


def itl_samples(
    trace: RunTrace, tokens: EventView | None = None, *, per_token: bool = True
) -> ItlSamples:
    """Pooled per-token and per-chunk ITL samples of the successful requests.

    ``tokens``: the chunks to read (default: token-bearing events); ``per_token=False``
    skips the per-token samples (``per_token`` is then ``None``).
    """
    tv = tokens if tokens is not None else event_view(trace)
    valid = valid_requests(trace)
    firsts = tv.first_positions()
    gaps = np.diff(tv.t_ns)  # gaps[j] = t[j+1] - t[j]
    drop = [firsts[firsts > 0] - 1]  # gap into a request's first event crosses requests
    all_valid = bool(valid[tv.has_any].all())
    if not all_valid:
        bad = ~tv.request_mask(valid)
        drop.append(np.flatnonzero(bad[1:]))
    exclude = np.unique(np.concatenate(drop)) if len(drop) > 1 else drop[0]
    if not per_token or tv.size == 0 or int(tv.tokens.max()) == 1:
        return ItlSamples(chunk_gaps=gaps, chunk_exclude=exclude, per_token=None)
    return ItlSamples(
        chunk_gaps=gaps, chunk_exclude=exclude, per_token=_per_token(tv, gaps, valid, all_valid)
    )


EVENT_BLOCK = 1 << 19  # events per block where a pass over every event builds in blocks


def event_requests(tv: EventView, start: int, stop: int) -> I64:
    """The request (row) of each event ``start .. stop - 1`` of ``tv``."""
    if stop <= start:
        return np.zeros(0, np.int64)
    first, last = np.searchsorted(tv.offsets, [start, stop - 1], side="right") - 1
    spans = tv.offsets[first : last + 2].copy()  # the requests' event ranges, cut to the block
    spans[0], spans[-1] = start, stop
    out: I64 = np.repeat(np.arange(first, last + 1, dtype=np.int64), np.diff(spans))
    return out


def itl_samples_ms(trace: RunTrace, tokens: EventView | None = None) -> F64:
    """The pooled per-token ITL samples of ``itl_samples`` in ms, in event order: the same
    values as ``per_token / NS_PER_MS`` (or ``per_chunk() / NS_PER_MS`` when every chunk
    carried one token), built so that a run of 10M chunks holds one float array of them
    (the one-token case reads the events in blocks instead of gathering every gap)."""
    tv = tokens if tokens is not None else event_view(trace)
    if tv.size == 0:
        return np.zeros(0)
    if int(tv.tokens.max()) != 1:
        s = itl_samples(trace, tv)
        assert s.per_token is not None
        out = s.per_token  # a fresh array (np.repeat): divided in place
        out /= NS_PER_MS
        return out
    valid = valid_requests(trace)
    out = np.empty(tv.size - 1, np.float64)
    m = 0
    for a in range(1, tv.size, EVENT_BLOCK):  # gap j - 1 -> j, for events j >= 1
        b = min(a + EVENT_BLOCK, tv.size)
        req = event_requests(tv, a, b)
        # a gap counts when it ends on a valid request's event that is not its first
        keep = valid[req] & (np.arange(a, b) != tv.offsets[req])
        del req
        gaps = np.subtract(tv.t_ns[a:b], tv.t_ns[a - 1 : b - 1])[keep]
        np.divide(gaps, NS_PER_MS, out=out[m : m + gaps.shape[0]])
        m += gaps.shape[0]
    out.resize(m, refcheck=False)  # in place: no second copy of the samples
    return out


def _per_token(tv: EventView, gaps: I64, valid: BoolArr, all_valid: bool) -> F64:
    first = np.zeros(tv.size, np.bool_)
    first[tv.first_positions()] = True
    k = tv.tokens.astype(np.int64)
    reps = np.where(first, k - 1, k)
    reps[np.repeat(tv.counts == 1, tv.counts)] = 0  # all tokens in one chunk: no samples
    vals = np.zeros(tv.size, np.float64)
    vals[1:] = gaps / k[1:]
    vals[first] = 0.0
    if not all_valid:
        keep = tv.request_mask(valid)
        reps, vals = reps[keep], vals[keep]
    out: F64 = np.repeat(vals, reps)
    return out
