"""Load shapes: when each request is scheduled, relative to the start of the measured phase.

Arrival processes follow ``vllm bench serve``: the first request goes at t = 0, then each
gap is drawn independently:

* ``poisson``: exponential gaps with mean ``1/rate``;
* ``gamma``: gamma gaps with ``shape = burstiness``, ``scale = 1/(rate * burstiness)``
  (mean ``1/rate``; coefficient of variation ``1/sqrt(burstiness)``: < 1 smoother than
  Poisson, > 1 burstier; burstiness 1 is Poisson);
* ``constant``: gaps of exactly ``1/rate``;
* ``rate = inf``: every request at t = 0.

Concurrency is a separate cap (``max_concurrency``): with ``rate = inf`` it is a fixed
concurrency run (C in flight, a new request as soon as one ends); with a finite rate,
requests start on schedule unless C are already in flight, and then wait for a slot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.client.spec import Arrival, RunSpec

I64 = npt.NDArray[np.int64]
NS = 1_000_000_000


def arrival_times_ns(
    n: int,
    *,
    rate: float,
    arrival: Arrival = "poisson",
    burstiness: float = 1.0,
    rng: np.random.Generator,
) -> I64:
    """Scheduled send times (ns from the phase start) for ``n`` requests, non-decreasing."""
    if n <= 0:
        return np.zeros(0, np.int64)
    if not rate > 0:
        raise ValueError("request rate must be > 0")
    if math.isinf(rate):
        return np.zeros(n, np.int64)
    if arrival == "constant":
        return np.round(np.arange(n, dtype=np.float64) * (NS / rate)).astype(np.int64)
    if arrival == "poisson":
        gaps = rng.exponential(1.0 / rate, size=n - 1)
    elif arrival == "gamma":
        if not burstiness > 0:
            raise ValueError("burstiness must be > 0")
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    else:
        raise ValueError(f"unknown arrival process {arrival!r}")
    t = np.zeros(n, np.float64)
    np.cumsum(gaps, out=t[1:])
    return np.round(t * NS).astype(np.int64)


@dataclass(frozen=True, slots=True)
class Schedule:
    """The measured phase's send times, plus the concurrency cap (None: unlimited)."""

    times_ns: I64
    max_concurrency: int | None
    warmup_requests: int

    @property
    def n(self) -> int:
        return int(self.times_ns.shape[0])

    @property
    def fixed_concurrency(self) -> bool:
        return self.max_concurrency is not None and bool(np.all(self.times_ns == 0))


def schedule_for(spec: RunSpec) -> Schedule:
    """The schedule of a run spec; seeded from ``spec.seed`` (a stream separate from the
    dataset's, so changing the load shape does not change the prompts)."""
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 1]))
    times = arrival_times_ns(
        spec.num_prompts,
        rate=spec.request_rate,
        arrival=spec.arrival,
        burstiness=spec.burstiness,
        rng=rng,
    )
    return Schedule(times, spec.max_concurrency, spec.warmup_requests)
