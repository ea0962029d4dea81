"""tokentrace's own metrics (SPEC §1-2), computed from a ``RunTrace`` with numpy only.

Vectorised over events through ``RunTrace.ev_offsets``: no Python loop per event or request.

* token-bearing event: kind CONTENT or REASONING with ``ev_tokens > 0``;
* TTFT = first token-bearing event - sent; TTFOT = first CONTENT event - sent;
  E2E = last token-bearing event - sent (not the server's "done" signal);
* n = ``output_tokens`` when known (>= 0), else the sum of ``ev_tokens`` over token events;
* TPOT = (t_last - t_first) / (n - 1), NaN when n < 2 (never 0 for n = 1);
* failed requests: NaN everywhere; ok requests without token events: NaN latencies.

Two aggregations, never mixed: per request (TTFT, TTFOT, E2E, TPOT: one sample per
successful request) and pooled (ITL per token; ITL per chunk).

A surface that generates no tokens (embeddings, rerank) answers once: E2E is its answer's
arrival, the token metrics do not apply, items/s counts what its answers carried
(``app.analysis.answers``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from app.domain import TOKEN_KINDS, EventKind, PerRequestMetrics, RequestStatus, RunTrace

from .answers import NO_TOKENS, answer_end_times, has_answers, items_answered
from .metric_defs import AGGREGATION
from .percentiles import Distribution, summarize
from .phases import NO_PHASES, phase_summary, user_ttft_ns

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
BoolArr = npt.NDArray[np.bool_]

NS_PER_MS = 1e6
NS_PER_S = 1e9
SLO_KEYS: tuple[str, ...] = ("ttft", "tpot", "e2el", "user_ttft")
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
    if values == [int(EventKind.CONTENT), int(EventKind.REASONING)]:
        out: BoolArr = trace.ev_kind <= EventKind.REASONING  # one comparison instead of isin
        return out
    if len(values) == 1:
        out = trace.ev_kind == values[0]
        return out
    out = np.isin(trace.ev_kind, values)
    return out


def _content_view(trace: RunTrace, tokens: EventView) -> EventView:
    """Token-bearing CONTENT events; the token view itself when the run has no reasoning."""
    if not bool(np.any(trace.ev_kind == EventKind.REASONING)):
        return tokens
    return event_view(trace, (EventKind.CONTENT,))


def valid_requests(trace: RunTrace) -> BoolArr:
    """Requests that can be latency samples: status ok and actually sent."""
    out: BoolArr = trace.ok & (trace.sent_ns >= 0)
    return out


def _since_sent(t_ns: I64, trace: RunTrace, valid: BoolArr) -> F64:
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


def _per_request(trace: RunTrace, tokens: EventView) -> PerRequestMetrics:
    valid = valid_requests(trace)
    t_first = tokens.first_t()
    t_last = tokens.last_t()
    content = _content_view(trace, tokens)
    n = output_token_counts(trace, tokens)
    ttft = _since_sent(t_first, trace, valid)
    if has_answers(trace):  # a whole answer (no tokens): E2E ends where it arrived
        t_last = np.where(t_last >= 0, t_last, answer_end_times(trace))
    e2e = _since_sent(t_last, trace, valid)
    tpot = np.full(trace.n_requests, np.nan)
    # two token-bearing events at least: tokens that all came at once (a non-streamed
    # answer, one chunk) say nothing about the time between tokens
    has_tpot = valid & (t_first >= 0) & (n >= 2) & (tokens.counts >= 2)
    tpot[has_tpot] = (t_last[has_tpot] - t_first[has_tpot]) / (n[has_tpot] - 1).astype(np.float64)
    return PerRequestMetrics(
        ttft_ns=ttft,
        ttfot_ns=_since_sent(content.first_t(), trace, valid),
        e2e_ns=e2e,
        tpot_ns=tpot,
        n_tokens=n.astype(np.int64),
    )


def per_request_metrics(trace: RunTrace) -> PerRequestMetrics:
    """Per-request TTFT, TTFOT, E2E and TPOT in ns (NaN where undefined), aligned with ``trace``."""
    return _per_request(trace, event_view(trace))


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


# --------------------------------------------------------------------------- run metrics


@dataclass(frozen=True, slots=True)
class Window:
    """The observation window throughputs divide by (run-relative ns)."""

    start_ns: int
    end_ns: int
    source: Literal["explicit", "default"]

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / NS_PER_S

    def to_dict(self) -> dict[str, object]:
        rule = (
            "given by the caller"
            if self.source == "explicit"
            else "first send of any request .. last request end or event, whichever is later"
        )
        return {
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "duration_s": self.duration_s,
            "source": self.source,
            "rule": rule,
        }


def default_window(trace: RunTrace) -> Window | None:
    """First ``sent_ns`` of any sent request .. max of ``end_ns`` and every event time."""
    sent = trace.sent_ns[trace.sent_ns >= 0]
    if sent.size == 0:
        return None
    start = int(sent.min())
    ends = [int(sent.max())]
    if np.any(trace.end_ns >= 0):
        ends.append(int(trace.end_ns.max()))
    if trace.n_events:
        ends.append(int(trace.ev_t_ns.max()))
    return Window(start_ns=start, end_ns=max(ends), source="default")


@dataclass(frozen=True, slots=True)
class Counts:
    """Measured requests by outcome: ``sent = ok + failed + cancelled`` (``not_sent``: never
    sent). ``failed`` is what the target did (error, timeout); ``cancelled`` is what the
    client cut (a stop, a cancel, the run's time limit: ``RequestStatus.CANCELLED``)."""

    total: int
    sent: int
    not_sent: int
    ok: int
    failed: int
    failed_by_status: dict[str, int]
    error_rate: float | None
    error_reasons: list[tuple[str, int]]
    cancelled: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "total": self.total,
            "sent": self.sent,
            "not_sent": self.not_sent,
            "completed_ok": self.ok,
            "failed": self.failed,
            "cancelled": self.cancelled,
            "failed_by_status": dict(self.failed_by_status),
            "error_rate": self.error_rate,
            "error_reasons": [{"reason": r, "count": c} for r, c in self.error_reasons],
        }


def count_requests(trace: RunTrace) -> Counts:
    """Requests sent / ok / failed / cancelled. Error rate = failed / sent (SPEC §2: every
    sent request, cancelled ones too, is in the denominator; a cancelled request is cut by
    the client, not an error of the target, so it is not in the numerator)."""
    sent_mask = trace.sent_ns >= 0
    ok_mask = trace.ok & sent_mask
    cut = np.array([s is RequestStatus.CANCELLED for s in trace.status], np.bool_)
    failed_idx = np.flatnonzero(sent_mask & ~trace.ok & ~cut)
    by_status: Counter[str] = Counter(str(trace.status[i]) for i in failed_idx)
    reasons: Counter[str] = Counter(
        trace.errors[i] or f"{trace.status[i]} (no message)" for i in failed_idx
    )
    sent = int(sent_mask.sum())
    failed = int(failed_idx.shape[0])
    return Counts(
        total=trace.n_requests,
        sent=sent,
        not_sent=trace.n_requests - sent,
        ok=int(ok_mask.sum()),
        failed=failed,
        failed_by_status=dict(sorted(by_status.items())),
        error_rate=failed / sent if sent else None,
        error_reasons=sorted(reasons.items(), key=lambda rc: (-rc[1], rc[0])),
        cancelled=int((sent_mask & cut).sum()),
    )


def _check_slos(slos_ms: dict[str, float] | None) -> dict[str, float]:
    slos = dict(slos_ms or {})
    for key, ms in slos.items():
        if key not in SLO_KEYS:
            raise ValueError(f"unknown SLO {key!r}; expected one of {SLO_KEYS}")
        if not ms > 0:
            raise ValueError(f"SLO {key} must be a positive number of ms, got {ms}")
    return slos


def good_requests(
    per_request: PerRequestMetrics,
    ok: BoolArr,
    slos_ms: dict[str, float],
    user_ttft: F64 | None = None,
) -> BoolArr:
    """Successful requests meeting every SLO in force (values in ms).

    TTFT, user-perceived TTFT (``user_ttft``, ns) and E2E must be defined and <= the SLO.
    An undefined TPOT (n < 2) meets a TPOT SLO, as in vLLM (which records TPOT 0 for such
    requests when checking goodput).
    """
    good = ok.copy()
    ttft = per_request.ttft_ns
    good &= np.isfinite(per_request.e2e_ns)  # answered: a token, or a whole answer
    if "ttft" in slos_ms:
        good &= ttft <= slos_ms["ttft"] * NS_PER_MS
    if "user_ttft" in slos_ms:
        if user_ttft is None:
            raise ValueError("a user_ttft SLO needs the requests' connection phases")
        good &= user_ttft <= slos_ms["user_ttft"] * NS_PER_MS
    if "e2el" in slos_ms:
        good &= per_request.e2e_ns <= slos_ms["e2el"] * NS_PER_MS
    if "tpot" in slos_ms:
        tpot = per_request.tpot_ns
        good &= np.isnan(tpot) | (tpot <= slos_ms["tpot"] * NS_PER_MS)
    return good


@dataclass(frozen=True, slots=True)
class RunMetrics:
    """Everything tokentrace reports for one run. Distributions are in ms."""

    counts: Counts
    window: Window | None
    input_tokens_total: int
    output_tokens_total: int
    input_throughput_tok_s: float | None
    items_total: int | None  # the items the answers carried (embeddings, rerank), else None
    items_per_s: float | None
    request_throughput_req_s: float | None
    output_throughput_tok_s: float | None
    total_token_throughput_tok_s: float | None
    slos_ms: dict[str, float]
    good_requests: int | None
    goodput_req_s: float | None
    distributions: dict[str, Distribution]
    summary_only: bool
    itl_no_data_reason: str | None = None
    e2e_end: str = "last_token"
    notes: list[str] = field(default_factory=list)
    phases: dict[str, object] = field(default_factory=dict)

    def dist(self, key: str) -> Distribution:
        """A distribution by key: "ttft_ms", "ttfot_ms", "e2el_ms", "tpot_ms", "itl_ms", ..."""
        return self.distributions[key]

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "requests": self.counts.to_dict(),
            "error_rate": self.counts.error_rate,
            "window": None if self.window is None else self.window.to_dict(),
            "input_tokens_total": self.input_tokens_total,
            "output_tokens_total": self.output_tokens_total,
            "input_throughput_tok_s": self.input_throughput_tok_s,
            "items_total": self.items_total,
            "items_per_s": self.items_per_s,
            "request_throughput_req_s": self.request_throughput_req_s,
            "output_throughput_tok_s": self.output_throughput_tok_s,
            "total_token_throughput_tok_s": self.total_token_throughput_tok_s,
            "slos_ms": dict(self.slos_ms),
            "good_requests": self.good_requests,
            "goodput_req_s": self.goodput_req_s,
            "summary_only": self.summary_only,
            "itl_no_data_reason": self.itl_no_data_reason,
            "e2e_end": self.e2e_end,
            "aggregation": dict(AGGREGATION),
            "notes": list(self.notes),
            "phases": dict(self.phases),
        }
        for key, dist in self.distributions.items():
            out[key] = dist.to_dict()
        return out


def _rate(amount: float, window: Window | None) -> float | None:
    if window is None or window.end_ns <= window.start_ns:
        return None
    return amount / window.duration_s


def resolve_window(trace: RunTrace, window_ns: tuple[int, int] | None) -> Window | None:
    if window_ns is None:
        return default_window(trace)
    start, end = int(window_ns[0]), int(window_ns[1])
    if end < start:
        raise ValueError(f"window end {end} is before its start {start}")
    return Window(start_ns=start, end_ns=end, source="explicit")


def _distributions(
    trace: RunTrace, prm: PerRequestMetrics, tokens: EventView, ci: bool, seed: int
) -> tuple[dict[str, Distribution], str | None]:
    per_request = {
        "ttft_ms": prm.ttft_ns,
        "ttfot_ms": prm.ttfot_ns,
        "e2el_ms": prm.e2e_ns,
        "tpot_ms": prm.tpot_ns,
    }
    out: dict[str, Distribution] = {}
    for i, (key, arr) in enumerate(per_request.items()):
        out[key] = summarize(arr, ci=ci, seed=seed + i).divided(NS_PER_MS)
    if trace.phases is None:
        out["user_ttft_ms"] = Distribution.no_data(NO_PHASES)
    else:
        user = user_ttft_ns(prm.ttft_ns, trace.phases)
        out["user_ttft_ms"] = summarize(user, ci=ci, seed=seed + 6).divided(NS_PER_MS)
    if trace.summary_only:
        empty = Distribution.no_data(SUMMARY_ONLY_REASON)
        out["itl_ms"] = empty
        out["itl_chunk_ms"] = empty
        return {k: out[k] for k in AGGREGATION}, SUMMARY_ONLY_REASON
    samples = itl_samples(trace, tokens)
    if samples.per_token is not None:
        itl = summarize(samples.per_token, ci=ci, seed=seed + 4, owned=True)
        out["itl_ms"] = itl.divided(NS_PER_MS)
    chunk = summarize(
        samples.chunk_gaps, ci=ci, seed=seed + 5, owned=True, exclude=samples.chunk_exclude
    ).divided(NS_PER_MS)
    out["itl_chunk_ms"] = chunk
    if samples.per_token is None:
        out["itl_ms"] = chunk
    out = {k: out[k] for k in AGGREGATION}
    return out, None


def slo_goodput(
    prm: PerRequestMetrics, ok: BoolArr, slos: dict[str, float], user_ttft: F64 | None
) -> tuple[int | None, list[str]]:
    """(good requests or None without SLOs, notes) for checked ``slos`` (ms)."""
    notes: list[str] = []
    n_good: int | None = None
    if "user_ttft" in slos and user_ttft is None:
        notes.append(f"no goodput: the user_ttft SLO needs connection phases ({NO_PHASES})")
    elif slos:
        n_good = int(good_requests(prm, ok, slos, user_ttft).sum())
    return n_good, notes


def metrics_with_slos(
    base: dict[str, object],
    prm: PerRequestMetrics,
    ok: BoolArr,
    user_ttft: F64 | None,
    slos_ms: dict[str, float] | None,
) -> dict[str, object]:
    """``compute_metrics(trace, slos_ms=slos_ms).to_dict()`` from ``base``, the same run's
    ``compute_metrics(trace, slos_ms={}).to_dict()``, and its per-request values (``prm``,
    ``ok`` = ``valid_requests``, ``user_ttft`` ns or None without phases): only the SLO
    fields depend on the SLOs, and they need no event."""
    slos = _check_slos(slos_ms)
    n_good, notes = slo_goodput(prm, ok, slos, user_ttft)
    w = base.get("window")
    window = (
        Window(start_ns=int(w["start_ns"]), end_ns=int(w["end_ns"]), source=w["source"])
        if isinstance(w, dict)
        else None
    )
    base_notes = base.get("notes")
    out = dict(base)
    out["slos_ms"] = dict(slos)
    out["good_requests"] = n_good
    out["goodput_req_s"] = None if n_good is None else _rate(n_good, window)
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
    not filtered by it. ``slos_ms`` keys: "ttft", "tpot", "e2el" (ms); goodput is ``None``
    without SLOs.
    """
    slos = _check_slos(slos_ms)
    tokens = event_view(trace)
    prm = _per_request(trace, tokens)
    counts = count_requests(trace)
    window = resolve_window(trace, window_ns)
    ok = valid_requests(trace)
    out_tokens = int(np.clip(prm.n_tokens[ok], 0, None).sum())
    in_tokens = int(np.clip(trace.input_tokens[ok], 0, None).sum())
    user = user_ttft_ns(prm.ttft_ns, trace.phases) if trace.phases is not None else None
    dists, itl_reason = _distributions(trace, prm, tokens, ci, seed)
    items = items_answered(trace, ok)
    answers_only = items is not None and tokens.size == 0
    if answers_only:  # nothing generated: the token metrics do not apply
        for key in dists:
            if key != "e2el_ms":
                dists[key] = Distribution.no_data(NO_TOKENS)
        itl_reason = NO_TOKENS
    n_good, notes = slo_goodput(prm, ok, slos, user)
    if counts.ok and bool(np.any(trace.input_tokens[ok] < 0)):
        notes.append(
            "some successful requests have no input token count: total throughput omits them"
        )
    return RunMetrics(
        counts=counts,
        window=window,
        input_tokens_total=in_tokens,
        output_tokens_total=out_tokens,
        input_throughput_tok_s=_rate(in_tokens, window),
        items_total=items,
        items_per_s=None if items is None else _rate(items, window),
        request_throughput_req_s=_rate(counts.ok, window),
        output_throughput_tok_s=None if answers_only else _rate(out_tokens, window),
        total_token_throughput_tok_s=_rate(in_tokens + out_tokens, window),
        slos_ms=slos,
        good_requests=n_good,
        goodput_req_s=None if n_good is None else _rate(n_good, window),
        distributions=dists,
        summary_only=trace.summary_only,
        itl_no_data_reason=itl_reason,
        e2e_end="answer" if answers_only else "last_token",
        notes=notes,
        phases=phase_summary(trace, ok),
    )
