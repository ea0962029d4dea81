"""Whether a probe's repeated measurements agree enough to be trusted. Pure.

A probe times each measurement (a copy size, a matrix product, a linear shape) ``iters``
times after warm-up and reports the median and the spread: ``(p90 - p10) / median`` of the
repetitions (``app.probes.timing.stats``). A measurement whose spread is over
``SPREAD_LIMIT`` (25%: the middle 80% of its repetitions differ by more than a quarter of
their median) is noisy: the device was shared, its clocks moved, or the work is too short
to time. Its median, and a ceiling or roofline point taken from it, cannot be trusted; the
probe pages say so and name the measurement. ``batch_scaling`` rows are single timed
generations per batch (no repetitions, no spread): nothing to judge there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

SPREAD_LIMIT = 0.25


@dataclass(frozen=True, slots=True)
class NoisyMeasurement:
    section: str  # "bandwidth", "matmul", "linear" or "sweep"
    label: str  # e.g. "copy 256 MiB", "bf16 square 4096", "prefill"
    spread: float


def _spread(row: Any) -> float | None:
    v = row.get("spread") if isinstance(row, Mapping) else None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def is_noisy(row: Any) -> bool:
    """A measured row whose spread is over the limit."""
    s = _spread(row)
    return s is not None and s > SPREAD_LIMIT


def _label(section: str, key: str, row: Mapping[str, Any]) -> str:
    if section == "bandwidth":
        size = row.get("size_bytes")
        return f"copy {int(size) // 2**20} MiB" if isinstance(size, int | float) else "copy"
    if section == "matmul":
        return f"{row.get('dtype', '?')} {row.get('shape', '?')}"
    if section == "sweep":
        return f"sweep M={row.get('m', '?')}"
    return key


def _rows(result: Mapping[str, Any] | None) -> list[tuple[str, str, Any]]:
    """(section, key, row) of every timed measurement in a probe's result."""
    res = result if isinstance(result, Mapping) else {}
    rows: list[tuple[str, str, Any]] = []
    for section in ("bandwidth", "matmul", "sweep"):
        items = res.get(section)
        if isinstance(items, list):
            rows += [(section, "", r) for r in items]
    shapes = res.get("shapes")
    if isinstance(shapes, Mapping):
        rows += [("linear", str(k), r) for k, r in shapes.items()]
    return [(section, key, r) for section, key, r in rows if _spread(r) is not None]


def noisy_measurements(result: Mapping[str, Any] | None) -> list[NoisyMeasurement]:
    """Every measurement of a probe's result whose spread is over ``SPREAD_LIMIT``."""
    return [
        NoisyMeasurement(section, _label(section, key, row), float(row["spread"]))
        for section, key, row in _rows(result)
        if is_noisy(row)
    ]


def noisy_ceilings(result: Mapping[str, Any] | None) -> list[str]:
    """The ceilings a roofline draws (``ceilings.summarize``: the best median over sizes)
    that come from a noisy measurement: "bandwidth", or a dtype's peak ("bf16")."""
    res = result if isinstance(result, Mapping) else {}
    out: list[str] = []
    bw = [r for r in res.get("bandwidth") or [] if isinstance(r, Mapping)]
    medians = [r.get("median_bps") for r in bw if isinstance(r.get("median_bps"), int | float)]
    if medians:
        best = max(bw, key=lambda r: float(r.get("median_bps") or 0.0))
        if is_noisy(best):
            out.append("bandwidth")
    by_dtype: dict[str, Mapping[str, Any]] = {}
    for r in res.get("matmul") or []:
        if not isinstance(r, Mapping) or not isinstance(r.get("median_flops_s"), int | float):
            continue
        d = str(r.get("dtype"))
        if d not in by_dtype or r["median_flops_s"] > by_dtype[d]["median_flops_s"]:
            by_dtype[d] = r
    out += [d for d, r in by_dtype.items() if is_noisy(r)]
    return out


def spread_verdict(result: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """None when every measurement is steady; else what the pages show: the noisy
    measurements, the worst spread, the ceilings taken from noisy ones, and one sentence."""
    noisy = noisy_measurements(result)
    if not noisy:
        return None
    worst = max(noisy, key=lambda n: n.spread)
    total = len(_rows(result))
    ceilings = noisy_ceilings(result)
    message = (
        f"Do not trust these figures: {len(noisy)} of {total} measurements varied by more than "
        f"{SPREAD_LIMIT:.0%} between repetitions (spread (p90 - p10) / median up to "
        f"{worst.spread:.0%}, {worst.label}): the device was busy, its clocks changed, or the "
        "work is too short to time. Run the probe again on an idle device."
    )
    if ceilings:
        message += f" Ceilings taken from a noisy measurement: {', '.join(ceilings)}."
    return {
        "limit": SPREAD_LIMIT,
        "noisy": [asdict(n) for n in noisy],
        "worst": worst.spread,
        "total": total,
        "ceilings": ceilings,
        "message": message,
    }
