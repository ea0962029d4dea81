"""A run's steady window (docs/metrics.md, "Steady window"): the longest stretch of the run
where the load was the load asked, and the registry's metrics over it.

* **closed loop** (``max_concurrency`` = C, no finite ``request_rate``, no ramp-up): the
  in-flight count ``n(t) = #{i : sent_i <= t < end_i}`` (a sent request without an end is in
  flight until the run's window ends) must stay ``>= STEADY_FRACTION * C`` (90%);
* **open loop** (a finite ``request_rate`` = λ, with or without a concurrency cap): the
  arrivals over the trailing window ``W = RATE_WINDOW_ARRIVALS / λ`` (the time the asked
  rate takes to send 50 requests), ``a(t) = #{i : t - W < sent_i <= t}``, must stay within
  ``RATE_TOLERANCE`` (10%) of the asked ``λ W``: ``0.9 λW <= a(t) <= 1.1 λW`` (the count
  at ``t`` counts sends in ``[t - W, t)``, the step function changing at each send and at
  each send + W);
* a ramp-up (the rate asked changes) or a spec with neither: no steady window.

Both counts are step functions of ``t``; the window is the longest union of stretches
where the bound holds, two stretches joined when the bound fails between them for at
most ``GAP_NS`` (10 ms: a closed loop sends the next request a few µs to ms after one ends,
when the in-flight count is one below C; with C < 10 that dip is below 90%). Ties: the
earliest. The window's figures are the registry's metrics (``compute_metrics``) over the
requests that **start** (are sent) inside the window, ``start_ns <= sent_i <= end_ns``,
with the window's duration as the throughput denominator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from app.domain import RunTrace

from .event_views import NS_PER_S
from .metrics import compute_metrics, default_window, metrics_with_slos

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
BoolArr = npt.NDArray[np.bool_]

STEADY_FRACTION = 0.9  # closed loop: in flight >= 90% of the concurrency asked
RATE_TOLERANCE = 0.1  # open loop: arrivals within 10% of the rate asked
RATE_WINDOW_ARRIVALS = 50  # open loop: the sliding window holds this many arrivals asked
GAP_NS = 10_000_000  # a dip of at most 10 ms does not end a stretch

LoadKind = Literal["concurrency", "rate"]


@dataclass(frozen=True, slots=True)
class LoadTarget:
    """The load a run asked for: a concurrency (closed loop) or a rate (req/s, open loop)."""

    kind: LoadKind
    value: float


@dataclass(frozen=True, slots=True)
class SteadyWindow:
    """The steady window (run-relative ns) and the rule that found it."""

    start_ns: int
    end_ns: int
    target: LoadTarget
    rule: str

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / NS_PER_S

    def to_dict(self) -> dict[str, object]:
        return {
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "start_s": self.start_ns / NS_PER_S,
            "end_s": self.end_ns / NS_PER_S,
            "duration_s": self.duration_s,
            "kind": self.target.kind,
            "target": self.target.value,
            "rule": self.rule,
        }


def _number(v: object) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)  # "inf" as a stored spec writes it
        except ValueError:
            return None
    return None


def load_target(spec: Mapping[str, object] | None) -> LoadTarget | None:
    """The load ``spec`` (a run's spec dict) asked for, or None (a ramp-up, neither)."""
    spec = spec or {}
    if spec.get("ramp_up_strategy") is not None:
        return None
    rate = _number(spec.get("request_rate"))
    if rate is not None and math.isfinite(rate) and rate > 0:
        return LoadTarget("rate", rate)
    conc = _number(spec.get("max_concurrency"))
    if conc is not None and conc >= 1:
        return LoadTarget("concurrency", conc)
    return None


def longest_stretch(
    starts: I64, ends: I64, lo: float, hi: float, gap_ns: int = GAP_NS
) -> tuple[int, int] | None:
    """The longest ``[a, b]`` where ``c(t) = #{i : starts_i <= t < ends_i}`` stays in
    ``[lo, hi]``, stretches joined across dips of at most ``gap_ns``; ties the earliest;
    None when it never holds for a positive time."""
    n = int(starts.shape[0])
    if n == 0:
        return None
    times = np.concatenate([starts, ends]).astype(np.int64)
    deltas = np.concatenate([np.ones(n, np.int64), -np.ones(n, np.int64)])
    order = np.argsort(times, kind="stable")
    times, level = times[order], np.cumsum(deltas[order])
    # the count after every change at one time: the last of each run of equal times
    last = np.flatnonzero(np.append(times[1:] != times[:-1], True))
    t, c = times[last], level[last]
    if t.shape[0] < 2:
        return None
    seg_start, seg_end, seg_c = t[:-1], t[1:], c[:-1]
    ok = np.flatnonzero((seg_c >= lo) & (seg_c <= hi) & (seg_end > seg_start))
    if ok.shape[0] == 0:
        return None
    s, e = seg_start[ok], seg_end[ok]
    new = np.concatenate([[True], (s[1:] - e[:-1]) > gap_ns])
    first = np.flatnonzero(new)
    last_of = np.append(first[1:] - 1, ok.shape[0] - 1)
    g_start, g_end = s[first], e[last_of]
    best = int(np.argmax(g_end - g_start))  # argmax: the first of equal maxima
    return int(g_start[best]), int(g_end[best])


def steady_window(trace: RunTrace, target: LoadTarget | None) -> SteadyWindow | None:
    """The run's steady window under the module's rule, or None (no target, no stretch)."""
    if target is None:
        return None
    sent_mask = trace.sent_ns >= 0
    starts = trace.sent_ns[sent_mask]
    if starts.shape[0] == 0:
        return None
    if target.kind == "concurrency":
        whole = default_window(trace)
        run_end = whole.end_ns if whole is not None else int(starts.max())
        ends = trace.end_ns[sent_mask]
        ends = np.where(ends >= 0, ends, run_end)
        lo = STEADY_FRACTION * target.value
        found = longest_stretch(starts, ends, lo, math.inf)
        rule = (
            f"in-flight requests >= {STEADY_FRACTION:.0%} of the concurrency asked "
            f"({lo:g} of {target.value:g}); dips of <= {GAP_NS / 1e6:g} ms joined"
        )
    else:
        w_ns = round(RATE_WINDOW_ARRIVALS / target.value * NS_PER_S)
        expect = target.value * w_ns / NS_PER_S
        lo, hi = (1 - RATE_TOLERANCE) * expect, (1 + RATE_TOLERANCE) * expect
        found = longest_stretch(starts, starts + w_ns, lo, hi)
        rule = (
            f"arrivals over the trailing {w_ns / NS_PER_S:g} s window within "
            f"{RATE_TOLERANCE:.0%} of the rate asked ({target.value:g} req/s: "
            f"{lo:g}..{hi:g} sends); dips of <= {GAP_NS / 1e6:g} ms joined"
        )
    if found is None:
        return None
    return SteadyWindow(found[0], found[1], target, rule)


def in_window(sent_ns: I64, window: SteadyWindow) -> BoolArr:
    """The requests that start inside the window (the rule its figures use)."""
    return (sent_ns >= window.start_ns) & (sent_ns <= window.end_ns)


def subset_trace(trace: RunTrace, keep: BoolArr) -> RunTrace:
    """The requests of ``trace`` where ``keep``, their events with them."""
    idx = np.flatnonzero(keep)
    offs = trace.ev_offsets
    counts = offs[idx + 1] - offs[idx]
    new_offs = np.zeros(idx.shape[0] + 1, np.int64)
    np.cumsum(counts, out=new_offs[1:])
    ev = np.repeat(keep, np.diff(offs))  # each event kept with its request
    return RunTrace(
        sent_ns=trace.sent_ns[idx],
        end_ns=trace.end_ns[idx],
        ok=trace.ok[idx],
        status=[trace.status[i] for i in idx],
        errors=[trace.errors[i] for i in idx],
        input_tokens=trace.input_tokens[idx],
        output_tokens=trace.output_tokens[idx],
        ev_offsets=new_offs,
        ev_t_ns=trace.ev_t_ns[ev],
        ev_kind=trace.ev_kind[ev],
        ev_tokens=trace.ev_tokens[ev],
        summary_only=trace.summary_only,
        clock_source=trace.clock_source,
        phases=None if trace.phases is None else {k: v[idx] for k, v in trace.phases.items()},
    )


def steady_metrics(
    trace: RunTrace,
    spec: Mapping[str, object] | None,
    *,
    slos_ms: dict[str, float] | None = None,
    seed: int = 0,
) -> dict[str, object]:
    """The run's steady block: ``{"window": ..., "requests": n, "metrics": ...}`` with the
    registry's metrics over the requests that start inside the window (the window's
    duration their throughput denominator), or ``{"window": None, "reason": ...}``."""
    target = load_target(spec)
    if target is None:
        return {"window": None, "reason": "the run asked no fixed concurrency or rate"}
    window = steady_window(trace, target)
    if window is None:
        return {
            "window": None,
            "reason": f"the load never held the {target.kind} asked",
        }
    keep = in_window(trace.sent_ns, window)
    sub = subset_trace(trace, keep)
    m = compute_metrics(
        sub, window_ns=(window.start_ns, window.end_ns), slos_ms=slos_ms or {}, seed=seed
    )
    return {
        "window": window.to_dict(),
        "requests": int(keep.sum()),
        "rule": "requests sent inside the window; throughputs over the window's duration",
        "metrics": m.to_dict(),
    }


def steady_with_slos(
    block: Mapping[str, object],
    sent_ns: I64,
    values: Mapping[str, F64],
    valid: BoolArr,
    slos_ms: dict[str, float] | None,
) -> dict[str, object]:
    """``steady_metrics(trace, spec, slos_ms=slos_ms)`` from the block computed without
    SLOs and the run's per-request columns (``sent_ns``, per-request ``values`` by metric
    key, ``valid``): only goodput depends on the SLOs (``metrics_with_slos``)."""
    window = block.get("window")
    base = block.get("metrics")
    if not isinstance(window, dict) or not isinstance(base, dict):
        return dict(block) or {"window": None, "reason": "not computed"}
    keep = (sent_ns >= int(window["start_ns"])) & (sent_ns <= int(window["end_ns"]))
    out = dict(block)
    out["metrics"] = metrics_with_slos(
        base, {k: v[keep] for k, v in values.items()}, valid[keep], slos_ms
    )
    return out
