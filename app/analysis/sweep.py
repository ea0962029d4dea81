"""Sweeps (SPEC §3): plan the loads, detect saturation, find the highest load meeting the SLO.

Pure functions over per-step summaries; the service runs the steps and stores them.

* **auto plan**: a synchronous run (concurrency 1) gives the lowest useful rate, a
  maximum-throughput run (all requests at once) the highest; ``auto_rates`` spreads rates
  evenly between them (as GuideLLM's sweep does).
* **achieved rate** of a step, by load kind:

  - *closed loop* (a concurrency step, or an open-loop step whose sends took less than one
    unqueued latency, e.g. the unlimited-rate probe): successful completions / (last request
    end - first send), the run's own success request throughput. Sends there wait for
    completions, so the send window says nothing about the rate the server sustained.
  - *open loop* (a finite rate): successful completions per second while requests were being
    sent, over the send window shifted by the unqueued latency (the median E2E of the first
    requests). An unsaturated server completes requests as fast as they are sent; a
    saturated one falls behind, and this rate drops to its capacity.
* **saturation** stops a sweep early: achieved < ``min_ratio`` x offered (rate sweeps), or
  throughput stopped rising while the load grew (concurrency sweeps), or the error rate
  exceeded ``max_error_rate``.
* **max goodput**: the highest-load step whose p99 latencies meet every SLO in force
  (ttft, tpot, e2el, in ms; MLPerf-style p99 limits) with an error rate within bounds. A step
  whose run cannot be trusted (client-limited, failed, over its error bound:
  ``app.analysis.trust.run_trust_issues``) is never picked; the result lists the skipped
  steps and why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from app.analysis.metric_defs import slo_metrics

I64 = npt.NDArray[np.int64]
BoolArr = npt.NDArray[np.bool_]

LoadKind = Literal["rate", "concurrency"]
DEFAULT_MIN_RATIO = 0.8
DEFAULT_MAX_ERROR_RATE = 0.05
MIN_GAIN = 1.05  # concurrency sweeps: throughput must rise >= 5% when the load grows >= 1.5x
SLO_PERCENTILE = "p99"


def auto_rates(sync_rps: float, max_rps: float, steps: int) -> list[float]:
    """``steps`` rates spread evenly from ``sync_rps`` to ``max_rps`` (both included).

    Raises ValueError unless 0 < sync_rps and both are finite; when max <= sync (the server
    serves no faster in parallel) a single rate is returned."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not (sync_rps > 0 and math.isfinite(sync_rps) and math.isfinite(max_rps)):
        raise ValueError(f"rates must be positive and finite, got {sync_rps}, {max_rps}")
    if max_rps <= sync_rps or steps == 1:
        return [round(max(sync_rps, max_rps), 6)]
    return [round(float(r), 6) for r in np.linspace(sync_rps, max_rps, steps)]


def achieved_rate(
    sent_ns: I64, end_ns: I64, ok: BoolArr, *, closed_loop: bool, head: int = 10
) -> float | None:
    """A step's achieved request rate (req/s; see the module doc for both rules).

    ``sent_ns`` / ``end_ns`` per request (-1 unknown). None with fewer than 2 sends or a
    zero-length window; 0.0 when no request succeeded."""
    sent_mask = sent_ns >= 0
    if int(sent_mask.sum()) < 2:
        return None
    t0, t1 = int(sent_ns[sent_mask].min()), int(sent_ns[sent_mask].max())
    good = ok & sent_mask & (end_ns >= 0)
    if not bool(good.any()):
        return 0.0
    order = np.argsort(sent_ns[good], kind="stable")
    first = (end_ns[good] - sent_ns[good])[order][: max(1, head)]
    shift = float(np.median(first))
    if closed_loop or t1 - t0 < shift:
        return _closed_loop_rate(t0, end_ns[sent_mask], int(good.sum()))
    ends = end_ns[good].astype(np.float64)
    done = int(np.sum((ends >= t0 + shift) & (ends <= t1 + shift)))
    # the first completion is the window's left edge: count the intervals, not the endpoints
    return max(done - 1, 0) / ((t1 - t0) / 1e9) if done else 0.0


def _closed_loop_rate(t0: int, ends_of_sent: I64, n_ok: int) -> float | None:
    """Successful completions over first send .. last end of any sent request."""
    t_end = int(ends_of_sent.max())
    return n_ok / ((t_end - t0) / 1e9) if t_end > t0 else None


@dataclass(frozen=True, slots=True)
class StepSummary:
    """One step of a sweep, from its run's report (latencies in ms)."""

    index: int
    load: float  # offered rate (req/s) or concurrency
    load_kind: LoadKind
    achieved_rps: float | None
    request_throughput_rps: float | None
    output_throughput_tok_s: float | None
    goodput_rps: float | None
    error_rate: float | None
    latency_ms: Mapping[str, Mapping[str, float | None]]  # metric -> {"p50": .., "p99": ..}
    run_id: str | None = None
    # a find-max sweep's SLO checks of the step (``slo_search.slo_checks``), else empty
    slo_checks: tuple[Mapping[str, object], ...] = ()

    def latency(self, metric: str, p: str) -> float | None:
        return (self.latency_ms.get(metric) or {}).get(p)


def saturation_reason(
    steps: Sequence[StepSummary],
    *,
    min_ratio: float = DEFAULT_MIN_RATIO,
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE,
) -> str | None:
    """Why the last step shows the server saturated, or None (the sweep may go on)."""
    if not steps:
        return None
    last = steps[-1]
    if last.error_rate is not None and last.error_rate > max_error_rate:
        return (
            f"errors climbed to {last.error_rate:.1%} at {_load_text(last)} "
            f"(limit {max_error_rate:.0%}): the server is overloaded"
        )
    if last.load_kind == "rate":
        if last.achieved_rps is not None and last.achieved_rps < min_ratio * last.load:
            return (
                f"achieved {last.achieved_rps:.2f} req/s at {last.load:g} req/s offered "
                f"(< {min_ratio:g} x offered): the server is saturated"
            )
        return None
    if len(steps) >= 2:
        prev = steps[-2]
        a, b = prev.output_throughput_tok_s, last.output_throughput_tok_s
        if a and b is not None and last.load >= 1.5 * prev.load and b < MIN_GAIN * a:
            return (
                f"throughput stopped rising: {b:,.0f} tok/s at concurrency {last.load:g} "
                f"vs {a:,.0f} at {prev.load:g}: the server is saturated"
            )
    return None


def _load_text(step: StepSummary) -> str:
    return f"{step.load:g} req/s" if step.load_kind == "rate" else f"concurrency {step.load:g}"


def meets_slo(
    step: StepSummary, slos_ms: Mapping[str, float], *, max_error_rate: float
) -> bool | None:
    """p99 of every SLO metric within its limit and errors within bounds; None: no SLOs."""
    if not slos_ms:
        return None
    if step.error_rate is None or step.error_rate > max_error_rate:
        return False
    by_slo = slo_metrics()
    for key, limit in slos_ms.items():
        value = step.latency(by_slo[key].key, SLO_PERCENTILE)
        if value is None or value > limit:
            return False
    return True


@dataclass(frozen=True, slots=True)
class SkippedStep:
    step: int  # index in the steps list
    load: float
    reasons: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "step": self.step,
            "load": self.load if math.isfinite(self.load) else None,
            "reasons": list(self.reasons),
        }


@dataclass(frozen=True, slots=True)
class MaxGoodput:
    step: int | None  # index in the steps list; None: no step meets the SLO
    load: float | None
    goodput_rps: float | None
    reason: str
    skipped: tuple[SkippedStep, ...] = ()  # steps never picked: their runs are untrusted

    def to_dict(self) -> dict[str, object]:
        return {
            "step": self.step,
            "load": self.load,
            "goodput_rps": self.goodput_rps,
            "reason": self.reason,
            "skipped": [s.to_dict() for s in self.skipped],
        }


def max_goodput(
    steps: Sequence[StepSummary],
    slos_ms: Mapping[str, float],
    *,
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE,
    untrusted: Mapping[int, Sequence[str]] | None = None,
) -> MaxGoodput:
    """The highest-load step meeting the SLO (see module doc); ``untrusted`` maps a step's
    index in ``steps`` to why its run cannot be trusted: such a step is skipped."""
    bad = {i: tuple(r) for i, r in (untrusted or {}).items() if r and 0 <= i < len(steps)}
    skipped = tuple(SkippedStep(i, steps[i].load, bad[i]) for i in sorted(bad))
    note = ""
    if skipped:
        parts = [f"{_load_text(steps[s.step])} ({'; '.join(s.reasons)})" for s in skipped]
        note = "; skipped untrusted steps: " + ", ".join(parts)
    if not slos_ms:
        return MaxGoodput(
            None, None, None, "no SLO set: give goodput SLOs to find max goodput" + note, skipped
        )
    ok = [
        (i, s)
        for i, s in enumerate(steps)
        if i not in bad and meets_slo(s, slos_ms, max_error_rate=max_error_rate)
    ]
    limits = ", ".join(f"{k} p99 <= {v:g} ms" for k, v in slos_ms.items())
    if not ok:
        return MaxGoodput(None, None, None, f"no step meets the SLO ({limits})" + note, skipped)
    i, s = max(ok, key=lambda t: t[1].load)
    return MaxGoodput(
        i, s.load, s.goodput_rps, f"highest load meeting {limits}: {_load_text(s)}" + note, skipped
    )
