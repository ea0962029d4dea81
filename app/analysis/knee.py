"""The knee of a batch-scaling curve: where extra batch stops buying throughput (SPEC
section 6). Pure.

Scaling efficiency from batch b1 to b2: ``(tps2 / tps1 - 1) / (b2 / b1 - 1)``; 1 is
linear scaling (memory-bound decode: the weights are read once per step whatever the
batch), 0 is flat. The knee is the last batch before the efficiency first falls below
``threshold``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_THRESHOLD = 0.3
UTIL_SATURATED = 90.0  # percent


@dataclass(frozen=True, slots=True)
class Knee:
    batch: int | None  # None: still scaling at the largest batch measured
    index: int | None
    efficiencies: list[float]  # one per consecutive pair
    explanation: str


def efficiencies(batches: Sequence[int], tokens_per_s: Sequence[float]) -> list[float]:
    if len(batches) != len(tokens_per_s):
        raise ValueError("batches and tokens_per_s must have the same length")
    out: list[float] = []
    for i in range(1, len(batches)):
        b0, b1 = batches[i - 1], batches[i]
        t0, t1 = tokens_per_s[i - 1], tokens_per_s[i]
        if b1 <= b0:
            raise ValueError("batches must increase")
        if t0 <= 0:
            raise ValueError("tokens_per_s must be positive")
        out.append((t1 / t0 - 1.0) / (b1 / b0 - 1.0))
    return out


def find_knee(
    batches: Sequence[int],
    tokens_per_s: Sequence[float],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    utilization: Sequence[float | None] | None = None,
    roof_fraction: Sequence[float | None] | None = None,
) -> Knee:
    """The knee with a one-paragraph explanation. ``utilization`` (percent) and
    ``roof_fraction`` (achieved FLOP/s over the measured roof) add evidence when known."""
    if len(batches) < 2:
        return Knee(None, None, [], "fewer than two batch sizes: no knee can be found")
    eff = efficiencies(batches, tokens_per_s)
    idx = next((i for i, e in enumerate(eff) if e < threshold), None)
    if idx is None:
        return Knee(
            None,
            None,
            eff,
            f"no knee up to batch {batches[-1]}: every step kept at least {threshold:.0%} of "
            f"linear scaling (last: {eff[-1]:.0%}); larger batches may still pay",
        )
    b = batches[idx]
    parts = [
        f"throughput {tokens_per_s[idx]:.1f} -> {tokens_per_s[idx + 1]:.1f} tok/s from batch "
        f"{b} to {batches[idx + 1]}: {eff[idx]:.0%} of linear scaling (below {threshold:.0%}), "
        f"so extra batch stops buying throughput after batch {b}"
    ]
    if idx > 0:
        parts.append(f"before it, scaling was {min(eff[:idx]):.0%} of linear or better")
    if utilization is not None and idx < len(utilization) and utilization[idx] is not None:
        u = float(utilization[idx])  # type: ignore[arg-type]
        if u >= UTIL_SATURATED:
            parts.append(
                f"device utilization is {u:.0f}% at the knee (saturated; utilization is not "
                "saturation of FLOP/s)"
            )
        else:
            parts.append(f"device utilization is only {u:.0f}% at the knee")
    if roof_fraction is not None and idx < len(roof_fraction) and roof_fraction[idx] is not None:
        f = float(roof_fraction[idx])  # type: ignore[arg-type]
        parts.append(f"achieved FLOP/s is {f:.0%} of the measured roof")
    return Knee(b, idx, eff, "; ".join(parts) + ".")
