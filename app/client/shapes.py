"""Load shapes: when each request is scheduled, relative to the start of the measured phase.

Arrival processes follow ``vllm bench serve``: the first request goes at t = 0, then each
gap is drawn independently:

* ``poisson``: exponential gaps with mean ``1/rate``;
* ``gamma``: gamma gaps with ``shape = burstiness``, ``scale = 1/(rate * burstiness)``
  (mean ``1/rate``; coefficient of variation ``1/sqrt(burstiness)``: < 1 smoother than
  Poisson, > 1 burstier; burstiness 1 is Poisson);
* ``constant``: gaps of exactly ``1/rate``;
* ``rate = inf``: every request at t = 0.

A ramp-up (``ramp_up_strategy``, vLLM's): request i's rate is ``r_i = start + (end -
start) * p`` (linear) or ``start * (end / start) ** p`` (exponential), ``p = i / max(N - 1,
1)``; the gap before request i (i >= 1) is drawn as above at ``r_i`` (vLLM also draws one
before the first request; here it goes at t = 0 as with every shape).

A timed dataset (a trace, ``Workload.at_ns``) gives the send times itself: they replace the
load shape.

Concurrency is a separate cap (``max_concurrency``): with ``rate = inf`` it is a fixed
concurrency run (C in flight, a new request as soon as one ends); with a finite rate,
requests start on schedule unless C are already in flight, and then wait for a slot.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.client.spec import Arrival, RampUp, RunSpec

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


def ramp_rates(n: int, strategy: RampUp, start: float, end: float) -> npt.NDArray[np.float64]:
    """Each request's rate under a ramp-up (vLLM's ``_get_current_request_rate``)."""
    p = np.arange(n, dtype=np.float64) / max(n - 1, 1)
    if strategy == "linear":
        return start + (end - start) * p
    if strategy == "exponential":
        return start * (end / start) ** p
    raise ValueError(f"unknown ramp-up strategy {strategy!r}")


def ramp_up_times_ns(
    n: int,
    *,
    strategy: RampUp,
    start: float,
    end: float,
    arrival: Arrival = "poisson",
    burstiness: float = 1.0,
    rng: np.random.Generator,
) -> I64:
    """Send times under a ramp-up: the gap before request i drawn at request i's rate."""
    if n <= 0:
        return np.zeros(0, np.int64)
    rates = ramp_rates(n, strategy, start, end)[1:]
    if arrival == "constant":
        gaps = 1.0 / rates
    elif arrival == "poisson":
        gaps = rng.exponential(1.0 / rates)
    elif arrival == "gamma":
        gaps = rng.gamma(shape=burstiness, scale=1.0 / (rates * burstiness))
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


def schedule_for(spec: RunSpec, at_ns: Sequence[int] | None = None) -> Schedule:
    """The schedule of a run spec; seeded from ``spec.seed`` (a stream separate from the
    dataset's, so changing the load shape does not change the prompts). ``at_ns``: a
    timed dataset's own send times (``Workload.at_ns``), used as they are."""
    if at_ns is not None:
        if len(at_ns) != spec.prompts:
            raise ValueError(f"the dataset gave {len(at_ns)} send times for {spec.prompts}")
        times = np.asarray(at_ns, np.int64)
        if times.size and (times[0] < 0 or np.any(np.diff(times) < 0)):
            raise ValueError("a dataset's send times must be >= 0 and non-decreasing")
        return Schedule(times, spec.max_concurrency, spec.warmup_requests)
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 1]))
    if spec.ramp_up_strategy is not None:
        assert spec.ramp_up_start_rps is not None and spec.ramp_up_end_rps is not None
        ramp = ramp_up_times_ns(
            spec.prompts,
            strategy=spec.ramp_up_strategy,
            start=spec.ramp_up_start_rps,
            end=spec.ramp_up_end_rps,
            arrival=spec.arrival,
            burstiness=spec.burstiness,
            rng=rng,
        )
        return Schedule(ramp, spec.max_concurrency, spec.warmup_requests)
    times = arrival_times_ns(
        spec.prompts,
        rate=spec.request_rate,
        arrival=spec.arrival,
        burstiness=spec.burstiness,
        rng=rng,
    )
    return Schedule(times, spec.max_concurrency, spec.warmup_requests)
