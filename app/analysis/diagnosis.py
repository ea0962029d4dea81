"""Diagnosis notes (SPEC §7 "locate", and §5 roofline): small pure rules over measurements.

Each rule returns a ``Note`` when its condition holds and ``None`` otherwise; the thresholds
are module constants and each rule's doc says exactly when it fires. ``run_notes`` and
``sweep_notes`` apply the rules that the available data allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from app.analysis.compare import rank_average
from app.analysis.metric_defs import TPOT, TTFT
from app.analysis.sweep import DEFAULT_MIN_RATIO, StepSummary

F64 = npt.NDArray[np.float64]

ROOFLINE_TOLERANCE = 0.10  # TPOT p50 within 10% of the weight-read floor
MIN_SAMPLES = 20
MIN_RHO = 0.5  # Spearman rank correlation counted as "grows with"
MIN_SPREAD = 1.5  # the x variable must vary: p90 / p10 at least this
MIN_RISE = 1.2  # top quartile / bottom quartile of y at least this
QUEUE_RISE = 2.0  # TTFT of the last quarter of sends vs the first quarter
HIGH_ERROR_RATE = 0.05
THROUGHPUT_DROP = 0.10
TPOT_LOAD_RISE = 1.5

Severity = Literal["info", "warn"]


@dataclass(frozen=True, slots=True)
class Note:
    rule: str
    severity: Severity
    text: str

    def to_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "severity": self.severity, "text": self.text}


def spearman(x: npt.ArrayLike, y: npt.ArrayLike) -> float | None:
    """Spearman rank correlation (average ranks for ties); None if either side is constant."""
    a = np.asarray(x, np.float64).ravel()
    b = np.asarray(y, np.float64).ravel()
    if a.size != b.size or a.size < 3:
        return None
    ra, _ = rank_average(a)
    rb, _ = rank_average(b)
    sa, sb = ra.std(), rb.std()
    if sa == 0 or sb == 0:
        return None
    return float(np.mean((ra - ra.mean()) * (rb - rb.mean())) / (sa * sb))


def _paired(x: npt.ArrayLike, y: npt.ArrayLike) -> tuple[F64, F64]:
    a = np.asarray(x, np.float64).ravel()
    b = np.asarray(y, np.float64).ravel()
    keep = np.isfinite(a) & np.isfinite(b) & (a >= 0)
    return a[keep], b[keep]


def _grows_with(x: F64, y: F64) -> tuple[float, float] | None:
    """(rho, rise) when y grows with x by the thresholds above, else None."""
    if x.size < MIN_SAMPLES:
        return None
    p10, p90 = np.percentile(x, [10, 90])
    if p10 <= 0 or p90 / p10 < MIN_SPREAD:
        return None
    rho = spearman(x, y)
    if rho is None or rho < MIN_RHO:
        return None
    order = np.argsort(x, kind="stable")
    q = max(1, x.size // 4)
    low, high = float(np.median(y[order[:q]])), float(np.median(y[order[-q:]]))
    if low <= 0 or high / low < MIN_RISE:
        return None
    return rho, high / low


# ------------------------------------------------------------------------------ run rules


def decode_memory_bound(
    tpot_p50_ms: float | None, floor_ms: float | None, *, device: str = "this device"
) -> Note | None:
    """Fires when TPOT p50 is at most ``1 + ROOFLINE_TOLERANCE`` times the weight-read floor
    (weights bytes / memory bandwidth, SPEC §5): each decode step is bound by reading weights."""
    if tpot_p50_ms is None or floor_ms is None or floor_ms <= 0:
        return None
    if tpot_p50_ms > floor_ms * (1 + ROOFLINE_TOLERANCE):
        return None
    if tpot_p50_ms < floor_ms * (1 - ROOFLINE_TOLERANCE):
        return Note(
            "roofline-below-floor",
            "warn",
            f"TPOT p50 {tpot_p50_ms:.2f} ms is below the weight-read floor {floor_ms:.2f} ms "
            f"for this model on {device}: check the model and device annotations (quantized "
            "weights, speculative decoding or several GPUs would explain it)",
        )
    return Note(
        "decode-memory-bound",
        "info",
        f"TPOT p50 {tpot_p50_ms:.2f} ms is within {ROOFLINE_TOLERANCE:.0%} of the weight-read "
        f"floor {floor_ms:.2f} ms for this model on {device}: decode is memory-bound; "
        "quantized weights or a larger batch would help",
    )


def prefill_bound(input_tokens: npt.ArrayLike, ttft_ms: npt.ArrayLike) -> Note | None:
    """Fires when, within one run (fixed load), TTFT rises with input length: Spearman
    rho >= 0.5 over >= 20 requests whose input lengths vary (p90/p10 >= 1.5), and the
    longest quarter's median TTFT is >= 1.2x the shortest quarter's."""
    x, y = _paired(input_tokens, ttft_ms)
    found = _grows_with(x, y)
    if found is None:
        return None
    rho, rise = found
    return Note(
        "prefill-bound",
        "info",
        f"TTFT grows with input length at fixed load (rank correlation {rho:.2f}; longest "
        f"prompts {rise:.1f}x slower to first token): prefill-bound (or queueing behind "
        "long prefills)",
    )


def kv_bound(context_tokens: npt.ArrayLike, tpot_ms: npt.ArrayLike) -> Note | None:
    """Fires when TPOT rises with context length (input + output tokens) by the same
    thresholds as ``prefill_bound``: decode is limited by bandwidth / KV-cache traffic."""
    x, y = _paired(context_tokens, tpot_ms)
    found = _grows_with(x, y)
    if found is None:
        return None
    rho, rise = found
    return Note(
        "kv-bound",
        "info",
        f"TPOT grows with context length (rank correlation {rho:.2f}; longest contexts "
        f"{rise:.1f}x slower per token): bandwidth / KV-cache traffic limits decode",
    )


def queue_builds(sent_ns: npt.ArrayLike, ttft_ms: npt.ArrayLike) -> Note | None:
    """Fires when, over >= 20 requests in send order, the median TTFT of the last quarter is
    >= 2x that of the first quarter: requests arrived faster than they were served."""
    x, y = _paired(sent_ns, ttft_ms)
    if x.size < MIN_SAMPLES:
        return None
    order = np.argsort(x, kind="stable")
    q = max(1, x.size // 4)
    first, last = float(np.median(y[order[:q]])), float(np.median(y[order[-q:]]))
    if first <= 0 or last / first < QUEUE_RISE:
        return None
    return Note(
        "queue-builds",
        "warn",
        f"TTFT rose through the run (median {first:.1f} ms in the first quarter of sends, "
        f"{last:.1f} ms in the last): requests queued; the offered load is above what the "
        "server sustains",
    )


def high_error_rate(error_rate: float | None, sent: int) -> Note | None:
    """Fires when more than 5% of sent requests failed (``error_rate``: errors and timeouts
    over sent; a request the client cut, ``cancelled``, is no failure, so a cancelled run
    never fires it): latencies describe the survivors."""
    if error_rate is None or sent <= 0 or error_rate <= HIGH_ERROR_RATE:
        return None
    return Note(
        "errors",
        "warn",
        f"{error_rate:.1%} of {sent} requests failed: latencies cover only the successes, "
        "and few successes can look fast",
    )


# ---------------------------------------------------------------------------- sweep rules


def queueing_saturation(
    steps: Sequence[StepSummary], *, min_ratio: float = DEFAULT_MIN_RATIO
) -> Note | None:
    """Rate sweeps: fires at the first step whose achieved rate fell below ``min_ratio`` x
    offered while TTFT p50 rose to >= 2x the lowest step's."""
    rate_steps = sorted((s for s in steps if s.load_kind == "rate"), key=lambda s: s.load)
    if len(rate_steps) < 2:
        return None
    base = rate_steps[0].latency(TTFT.key, "p50")
    if base is None or base <= 0:
        return None
    for i, s in enumerate(rate_steps):
        ttft = s.latency(TTFT.key, "p50")
        fell = s.achieved_rps is not None and s.achieved_rps < min_ratio * s.load
        if fell and ttft is not None and ttft >= QUEUE_RISE * base:
            where = f"above {rate_steps[i - 1].load:g} req/s" if i else f"at {s.load:g} req/s"
            return Note(
                "queueing",
                "warn",
                f"achieved rate fell below offered {where} while TTFT rose "
                f"({base:.1f} -> {ttft:.1f} ms p50): queueing — the server saturated",
            )
    return None


def throughput_falls(steps: Sequence[StepSummary]) -> Note | None:
    """Fires when output throughput at a higher load is >= 10% below the sweep's peak."""
    ordered = sorted(steps, key=lambda s: s.load)
    tput = [s.output_throughput_tok_s for s in ordered]
    if len(ordered) < 3 or any(t is None for t in tput):
        return None
    vals = [float(t) for t in tput if t is not None]
    peak = int(np.argmax(vals))
    if peak == len(vals) - 1:
        return None
    worst = min(vals[peak + 1 :])
    if worst > (1 - THROUGHPUT_DROP) * vals[peak]:
        return None
    unit = "req/s" if ordered[peak].load_kind == "rate" else "concurrency"
    return Note(
        "throughput-falls",
        "warn",
        f"throughput peaked at {vals[peak]:,.0f} tok/s ({ordered[peak].load:g} {unit}) and "
        f"fell to {worst:,.0f} tok/s at higher load: scheduling or overload",
    )


def tpot_grows_with_load(steps: Sequence[StepSummary]) -> Note | None:
    """Fires when TPOT p50 at the highest load is >= 1.5x that at the lowest: per-token time
    rises with the batch (SPEC §5: decode at batch B), the price of higher throughput."""
    ordered = sorted(steps, key=lambda s: s.load)
    if len(ordered) < 2:
        return None
    lo, hi = ordered[0].latency(TPOT.key, "p50"), ordered[-1].latency(TPOT.key, "p50")
    if lo is None or hi is None or lo <= 0 or hi / lo < TPOT_LOAD_RISE:
        return None
    return Note(
        "tpot-load",
        "info",
        f"TPOT p50 rose from {lo:.2f} to {hi:.2f} ms as load grew: larger batches make each "
        "decode step slower (KV traffic and compute per step)",
    )


def sweep_notes(steps: Sequence[StepSummary]) -> list[Note]:
    rules = (queueing_saturation(steps), throughput_falls(steps), tpot_grows_with_load(steps))
    return [n for n in rules if n is not None]


def run_notes(
    *,
    input_tokens: npt.ArrayLike,
    output_tokens: npt.ArrayLike,
    sent_ns: npt.ArrayLike,
    ttft_ms: npt.ArrayLike,
    tpot_ms: npt.ArrayLike,
    error_rate: float | None,
    sent: int,
    tpot_p50_ms: float | None = None,
    weight_floor_ms: float | None = None,
    device: str = "this device",
) -> list[Note]:
    """Every run rule the data allows (per-request arrays aligned; NaN where undefined)."""
    inp = np.asarray(input_tokens, np.float64)
    out = np.asarray(output_tokens, np.float64)
    context = np.where((inp >= 0) & (out >= 0), inp + out, np.nan)
    rules = (
        high_error_rate(error_rate, sent),
        decode_memory_bound(tpot_p50_ms, weight_floor_ms, device=device),
        queue_builds(sent_ns, ttft_ms),
        prefill_bound(np.where(inp >= 0, inp, np.nan), ttft_ms),
        kv_bound(context, tpot_ms),
    )
    return [n for n in rules if n is not None]
