"""Headline metrics as other tools define them ("definition profiles"), from one ``RunTrace``.

Every profile returns the same structure (``ProfileResult``: metric key -> ``ProfileMetric``
with its definition text, count, mean, std and p50/p90/p95/p99/p99.9/max, or a scalar
``value`` for throughputs) so a page can show them side by side. Differences come from the
definitions alone: every profile reads the same events and divides throughputs by the same
observation window (``metrics.default_window`` unless one is given).

Sources (see docs/metrics.md): vLLM ``bench serve`` 0.33,
GuideLLM 0.8, AIPerf 0.13.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from app.domain import TOKEN_KINDS, EventKind, RunTrace

from .metric_defs import AGG_TEXT, shown
from .metrics import (
    NS_PER_MS,
    EventView,
    Window,
    compute_metrics,
    event_view,
    itl_samples,
    output_token_counts,
    resolve_window,
    valid_requests,
)
from .percentiles import (
    PERCENTILES,
    Distribution,
    percentile_key,
    summarize,
    weighted_cdf_percentiles,
    weighted_mean_std,
)

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
BoolArr = npt.NDArray[np.bool_]

Profile = Literal["tokentrace", "vllm", "vllm-legacy", "guidellm", "aiperf"]
PROFILES: tuple[Profile, ...] = ("tokentrace", "vllm", "guidellm", "aiperf")
ALL_PROFILES: tuple[Profile, ...] = (*PROFILES, "vllm-legacy")

PercentileMethod = Literal["linear", "weighted-cdf"]


@dataclass(frozen=True, slots=True)
class ProfileMetric:
    """One headline figure as a tool defines it. Latencies in ms."""

    label: str
    unit: str
    definition: str
    aggregation: str
    count: int = 0
    mean: float | None = None
    std: float | None = None
    percentiles: dict[float, float | None] = field(default_factory=dict)
    value: float | None = None  # scalars (throughputs)
    reason: str | None = None  # why there is no data

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "label": self.label,
            "unit": self.unit,
            "definition": self.definition,
            "aggregation": self.aggregation,
            "count": self.count,
            "mean": self.mean,
            "std": self.std,
        }
        for p in PERCENTILES:
            out[percentile_key(p)] = self.percentiles.get(p)
        out["value"] = self.value
        if self.reason is not None:
            out["reason"] = self.reason
        return out


@dataclass(frozen=True, slots=True)
class ProfileResult:
    profile: Profile
    tool: str
    percentile_method: PercentileMethod
    metrics: dict[str, ProfileMetric]
    window: Window | None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {
            "profile": self.profile,
            "tool": self.tool,
            "percentile_method": self.percentile_method,
            "window": None if self.window is None else self.window.to_dict(),
            "metrics": {k: m.to_dict() for k, m in self.metrics.items()},
            "notes": list(self.notes),
        }


# --------------------------------------------------------------------------- building blocks


@dataclass(frozen=True, slots=True)
class _Ctx:
    """What every profile reads: the trace, its window, successful requests, token view."""

    trace: RunTrace
    window: Window | None
    valid: BoolArr
    tokens: EventView

    @property
    def sent(self) -> I64:
        return self.trace.sent_ns

    def since_sent_ms(self, t_ns: I64) -> F64:
        ok = self.valid & (t_ns >= 0)
        out = np.full(t_ns.shape[0], np.nan)
        out[ok] = (t_ns[ok] - self.sent[ok]) / NS_PER_MS
        return out


def _from_dist(
    dist: Distribution, label: str, unit: str, definition: str, aggregation: str
) -> ProfileMetric:
    return ProfileMetric(
        label=label,
        unit=unit,
        definition=definition,
        aggregation=aggregation,
        count=dist.count,
        mean=dist.mean,
        std=dist.std,
        percentiles=dict(dist.percentiles),
        reason=dist.reason,
    )


def _linear(
    values: npt.ArrayLike, label: str, definition: str, aggregation: str = "per request"
) -> ProfileMetric:
    """numpy-linear percentiles (vLLM, AIPerf), no CI."""
    dist = summarize(values, ci=False)
    return _from_dist(dist, label, "ms", definition, aggregation)


def _weighted(
    values: F64, weights: F64, label: str, definition: str, aggregation: str
) -> ProfileMetric:
    """GuideLLM: weighted mean, percentiles from the weighted CDF without interpolation."""
    keep = np.isfinite(values) & (weights > 0)
    v, w = values[keep], weights[keep]
    mean, std = weighted_mean_std(v, w)
    return ProfileMetric(
        label=label,
        unit="ms",
        definition=definition,
        aggregation=aggregation,
        count=int(v.size),
        mean=mean,
        std=std,
        percentiles=weighted_cdf_percentiles(v, w, PERCENTILES),
        reason=None if v.size else "no samples",
    )


def _scalar(label: str, unit: str, definition: str, value: float | None) -> ProfileMetric:
    return ProfileMetric(
        label=label, unit=unit, definition=definition, aggregation="run", value=value
    )


def _rate(amount: float, window: Window | None) -> float | None:
    if window is None or window.end_ns <= window.start_ns:
        return None
    return amount / window.duration_s


def _throughputs(ctx: _Ctx, n_out: I64, labels: tuple[str, str, str]) -> dict[str, ProfileMetric]:
    ok = ctx.valid
    out_total = float(np.clip(n_out[ok], 0, None).sum())
    in_total = float(np.clip(ctx.trace.input_tokens[ok], 0, None).sum())
    span = "successful requests / window"
    return {
        "request_throughput": _scalar(labels[0], "req/s", span, _rate(int(ok.sum()), ctx.window)),
        "output_throughput": _scalar(
            labels[1],
            "tok/s",
            "output tokens of successful requests / window",
            _rate(out_total, ctx.window),
        ),
        "total_token_throughput": _scalar(
            labels[2],
            "tok/s",
            "input + output tokens of successful requests / window",
            _rate(in_total + out_total, ctx.window),
        ),
    }


def _no_per_chunk(label: str, definition: str, aggregation: str, reason: str) -> ProfileMetric:
    return ProfileMetric(
        label=label, unit="ms", definition=definition, aggregation=aggregation, reason=reason
    )


# --------------------------------------------------------------------------- profiles


def _tokentrace(ctx: _Ctx, window_ns: tuple[int, int] | None) -> ProfileResult:
    m = compute_metrics(ctx.trace, window_ns=window_ns, ci=False)
    metrics: dict[str, ProfileMetric] = {}
    for md in shown("profile"):
        row = md.profile
        assert row is not None  # the profile view needs its row
        if md.aggregation == "per_run":
            metrics[row.key] = _scalar(row.label, md.unit, row.definition, m.rate(md.key))
        else:
            agg = AGG_TEXT[md.aggregation]
            metrics[row.key] = _from_dist(m.dist(md.key), row.label, md.unit, row.definition, agg)
    return ProfileResult(
        profile="tokentrace",
        tool="tokentrace (SPEC)",
        percentile_method="linear",
        metrics=metrics,
        window=m.window,
        notes=list(m.notes),
    )


def _vllm(ctx: _Ctx, legacy: bool) -> ProfileResult:
    trace = ctx.trace
    if legacy:
        chunks = event_view(trace, (*TOKEN_KINDS, EventKind.ROLE), require_tokens=False)
        data = event_view(
            trace, (*TOKEN_KINDS, EventKind.ROLE, EventKind.USAGE), require_tokens=False
        )
        t_end = data.last_t()
    else:
        chunks = ctx.tokens
        t_end = chunks.last_t()
    n = output_token_counts(trace, ctx.tokens)
    ttft = ctx.since_sent_ms(chunks.first_t())
    e2el = ctx.since_sent_ms(t_end)
    tpot = np.where(n > 1, (e2el - ttft) / np.maximum(n - 1, 1), np.nan)
    first = (
        "first chunk with non-empty choices (a role-only chunk counts)"
        if legacy
        else ("first data message carrying generated text (role-only chunk skipped)")
    )
    metrics = {
        "ttft": _linear(ttft, "TTFT", f"{first} - send"),
        "itl": _itl_per_chunk(ctx, chunks, "ITL", "gap between consecutive chunks after the first"),
        "tpot": _linear(tpot, "TPOT", "(E2EL - TTFT) / (output_len - 1), output_len > 1"),
        "e2el": _linear(
            e2el,
            "E2EL",
            "last data message (usage chunk included) - send"
            if legacy
            else "last token chunk - send",
        ),
        **_throughputs(
            ctx, n, ("Request throughput", "Output token throughput", "Total token throughput")
        ),
    }
    notes = [
        "vLLM prints 0 for a metric without samples; shown here as no data",
        "output_len: usage.completion_tokens, else the local tokenizer (the trace's count)",
    ]
    if legacy:
        notes.append(
            "older vLLM: TTFT at the first chunk with non-empty choices, role-only included"
        )
    return ProfileResult(
        profile="vllm-legacy" if legacy else "vllm",
        tool="vLLM bench serve (pre-0.33)" if legacy else "vLLM bench serve 0.33",
        percentile_method="linear",
        metrics=metrics,
        window=ctx.window,
        notes=notes,
    )


def _itl_per_chunk(ctx: _Ctx, chunks: EventView, label: str, definition: str) -> ProfileMetric:
    aggregation = "per chunk, pooled"
    if ctx.trace.summary_only:
        return _no_per_chunk(label, definition, aggregation, "summary-only run: no chunk times")
    samples = itl_samples(ctx.trace, chunks, per_token=False)
    dist = summarize(samples.chunk_gaps, ci=False, owned=True, exclude=samples.chunk_exclude)
    return _from_dist(dist.divided(NS_PER_MS), label, "ms", definition, aggregation)


def _guidellm(ctx: _Ctx) -> ProfileResult:
    trace, tv = ctx.trace, ctx.tokens
    # GuideLLM counts server usage when reported, else token iterations (chunks)
    n = np.where(trace.output_tokens >= 0, trace.output_tokens, tv.counts).astype(np.float64)
    t_first, t_last = tv.first_t(), tv.last_t()
    ttft = ctx.since_sent_ms(t_first)
    last_ms = ctx.since_sent_ms(t_last)
    itl = np.where(n > 1, (last_ms - ttft) / np.maximum(n - 1, 1), np.nan)
    tpot = np.where(n >= 1, last_ms / np.maximum(n, 1), np.nan)
    end = np.where(trace.end_ns >= 0, trace.end_ns, t_last)
    ones = np.ones(trace.n_requests)
    metrics = {
        "ttft": _weighted(
            ttft, ones, "TTFT", "first token iteration - request start", "per request"
        ),
        "ttfot": _weighted(
            ctx.since_sent_ms(_content_first(ctx)),
            ones,
            "TTFOT",
            "first output (non-reasoning) token - request start",
            "per request",
        ),
        "itl": _weighted(
            itl,
            np.where(n > 1, n - 1, 0.0),
            "ITL",
            "(last token - first token) / (output tokens - 1)",
            "per request, weighted by n - 1",
        ),
        "tpot": _weighted(
            tpot,
            np.where(n >= 1, n, 0.0),
            "TPOT",
            "(last token - request start) / output tokens (first token included)",
            "per request, weighted by n",
        ),
        "e2el": _weighted(
            ctx.since_sent_ms(end),
            ones,
            "Request latency",
            "request end - request start",
            "per request",
        ),
        **_throughputs(
            ctx, n.astype(np.int64), ("Requests/s", "Output tokens/s", "Total tokens/s")
        ),
    }
    notes = [
        "percentiles: first value whose weighted CDF reaches p (no interpolation); ties "
        "merged and weights normalised before summing, as GuideLLM 0.8.1",
        "output tokens: server usage when known, else number of token iterations (chunks)",
        "request latency ends at the request end (stream close), not the last token",
    ]
    return ProfileResult(
        profile="guidellm",
        tool="GuideLLM 0.8.1",
        percentile_method="weighted-cdf",
        metrics=metrics,
        window=ctx.window,
        notes=notes,
    )


def _content_first(ctx: _Ctx) -> I64:
    return event_view(ctx.trace, (EventKind.CONTENT,)).first_t()


def _aiperf(ctx: _Ctx) -> ProfileResult:
    trace, tv = ctx.trace, ctx.tokens
    n = output_token_counts(trace, tv)
    ttft = ctx.since_sent_ms(tv.first_t())
    latency = ctx.since_sent_ms(tv.last_t())
    second = tv.nth_t(1)
    ttst = np.where(second >= 0, ctx.since_sent_ms(second) - ttft, np.nan)
    itl = np.where(n > 1, (latency - ttft) / np.maximum(n - 1, 1), np.nan)
    metrics = {
        "ttft": _linear(ttft, "Time to first token", "first non-empty response - request start"),
        "ttst": _linear(ttst, "Time to second token", "second response - first response"),
        "itl": _linear(itl, "Inter token latency", "(request latency - TTFT) / (OSL - 1), OSL > 1"),
        "inter_chunk_latency": _itl_per_chunk(
            ctx, tv, "Inter chunk latency", "gap between consecutive responses"
        ),
        "e2el": _linear(latency, "Request latency", "last response - request start"),
        **_throughputs(
            ctx, n, ("Request throughput", "Output token throughput", "Total token throughput")
        ),
    }
    notes = [
        "AIPerf's ITL is a per-request average: vLLM's TPOT, not a per-gap sample",
        "OSL: local tokenizer by default (--use-server-token-count: usage); here the trace's",
    ]
    return ProfileResult(
        profile="aiperf",
        tool="AIPerf 0.13",
        percentile_method="linear",
        metrics=metrics,
        window=ctx.window,
        notes=notes,
    )


_DISPATCH: dict[Profile, Callable[[_Ctx, tuple[int, int] | None], ProfileResult]] = {
    "tokentrace": _tokentrace,
    "vllm": lambda ctx, _w: _vllm(ctx, legacy=False),
    "vllm-legacy": lambda ctx, _w: _vllm(ctx, legacy=True),
    "guidellm": lambda ctx, _w: _guidellm(ctx),
    "aiperf": lambda ctx, _w: _aiperf(ctx),
}


def profile_metrics(
    trace: RunTrace, profile: str, *, window_ns: tuple[int, int] | None = None
) -> ProfileResult:
    """Headline metrics of ``trace`` as ``profile`` defines them (one of ``ALL_PROFILES``).

    Raises ``ValueError`` for an unknown profile name.
    """
    if profile not in _DISPATCH:
        raise ValueError(f"unknown profile {profile!r}; expected one of {ALL_PROFILES}")
    ctx = _Ctx(
        trace=trace,
        window=resolve_window(trace, window_ns),
        valid=valid_requests(trace),
        tokens=event_view(trace),
    )
    return _DISPATCH[profile](ctx, window_ns)


def compare_profiles(
    trace: RunTrace,
    profiles: Sequence[str] = PROFILES,
    *,
    window_ns: tuple[int, int] | None = None,
) -> dict[str, ProfileResult]:
    """Several profiles of one trace, keyed by profile name, for a side-by-side view."""
    return {p: profile_metrics(trace, p, window_ns=window_ns) for p in profiles}
