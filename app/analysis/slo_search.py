"""SLO capacity search (docs/sweeps.md, "Find the largest load meeting SLOs"): the largest
concurrency or rate whose SLOs hold with the asked confidence. Pure: the SLOs and their
parsing, a step's check, the search's next load and its answer.

* an **SLO** ``METRIC:PCT:LIMIT``: the registry's SLO name (``Metric.slo``: ttft, tpot,
  e2el, user_ttft), a percentile in (0, 100] ("p99" or "99") and a limit in ms (> 0);
* a step **holds** an SLO with confidence ``c`` when the one-sided upper confidence bound of
  its percentile is within the limit: the ``c`` quantile of the percentile's bootstrap
  draws (``percentiles.bootstrap_percentiles``, the one bootstrap the runs' 95% intervals
  and comparisons use; 1,000 resamples, seeded per metric) over the step's successful
  requests' values. Past ``BOOTSTRAP_MAX_N`` samples, the distribution-free order
  statistic at ``N q + z_c sqrt(N q (1 - q))``. A step **passes** when it holds every SLO
  and its error rate is within the sweep's ``max_error_rate``; a step without a sample of a
  metric fails;
* **the search**: from ``start``, the load doubles while steps pass (the over-saturation
  stop, going up only: a step whose throughput rose less than 5% over the largest passing
  step's while its load grew >= 1.5x counts as failing, and no higher load is tried; a step
  whose SLO value is over 10x its limit is said to be over-saturated); then bisection
  between the largest passing and the smallest failing load, until they are adjacent
  (concurrency: 1 apart; rate: within ``rate_resolution``, 5%) or ``max_steps`` ran.
  The answer is the interval ``[largest passing, smallest failing]`` (either end None when
  no step passed or none failed up to ``max_load``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from app.analysis.metric_defs import slo_metrics
from app.analysis.percentiles import BOOTSTRAP_MAX_N, BOOTSTRAP_RESAMPLES, bootstrap_percentiles

F64 = npt.NDArray[np.float64]
BoolArr = npt.NDArray[np.bool_]

FindKind = Literal["concurrency", "rate"]
FIND_KINDS: tuple[FindKind, ...] = ("concurrency", "rate")
DEFAULT_CONFIDENCE = 0.95
DEFAULT_MAX_STEPS = 10
MAX_STEPS_LIMIT = 32
RATE_RESOLUTION = 0.05  # rate search: stop when smallest failing / largest passing <= 1.05
MIN_GAIN = 1.05  # over-saturation: throughput must rise >= 5% ...
MIN_GROWTH = 1.5  # ... when the load grew >= 1.5x
EXPLODED = 10.0  # over-saturation: a p99 over 10x its SLO limit
SLO_SEED = 2027  # the bootstrap seed of a step's SLO checks (+ the metric's own seed)


class SloError(ValueError):
    """A bad find-max setting; ``field`` names it (the CLI flag / API field)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class Slo:
    name: str  # the registry's SLO name: "tpot"
    pct: float  # (0, 100]
    limit_ms: float

    @property
    def metric_key(self) -> str:
        return slo_metrics()[self.name].key

    @property
    def text(self) -> str:
        return f"{self.name}:p{self.pct:g}:{self.limit_ms:g}"

    def to_dict(self) -> dict[str, object]:
        return {"metric": self.name, "pct": self.pct, "limit_ms": self.limit_ms}


def parse_slo(text: str, field: str = "slo") -> Slo:
    """``METRIC:PCT:LIMIT`` ("tpot:p99:50", "ttft:99.9:500"); SloError naming the part."""
    parts = str(text).strip().split(":")
    if len(parts) != 3:
        raise SloError(field, f"{text!r} is not METRIC:PCT:LIMIT (e.g. tpot:p99:50)")
    name, pct_text, limit_text = (p.strip() for p in parts)
    return make_slo(name, pct_text, limit_text, field)


def make_slo(name: str, pct: object, limit: object, field: str = "slo") -> Slo:
    """An SLO from its three parts, each checked; SloError naming the field."""
    known = slo_metrics()
    if name not in known:
        raise SloError(field, f"unknown metric {name!r} (one of {', '.join(known)})")
    try:
        p = float(str(pct).strip().lower().removeprefix("p").replace("_", "."))
    except ValueError:
        raise SloError(field, f"percentile {pct!r} is not a number (e.g. p99)") from None
    if not (0 < p <= 100):
        raise SloError(field, f"percentile {p:g} is out of range (0, 100]")
    try:
        lim = float(str(limit).strip())
    except ValueError:
        raise SloError(field, f"limit {limit!r} is not a number of ms") from None
    if not (math.isfinite(lim) and lim > 0):
        raise SloError(field, f"limit {lim:g} must be a positive number of ms")
    return Slo(name, p, lim)


@dataclass(frozen=True, slots=True)
class FindMax:
    """What a find-max sweep searches: the load kind, its SLOs, the confidence, the step
    budget and the load range."""

    kind: FindKind
    slos: tuple[Slo, ...]
    confidence: float = DEFAULT_CONFIDENCE
    max_steps: int = DEFAULT_MAX_STEPS
    start: float = 1.0
    max_load: float = 1024.0
    rate_resolution: float = RATE_RESOLUTION

    def __post_init__(self) -> None:
        if self.kind not in FIND_KINDS:
            raise SloError("find_max", f"unknown load {self.kind!r} (concurrency or rate)")
        if not self.slos:
            raise SloError("slo", "a find-max sweep needs at least one SLO")
        if not (0 < self.confidence < 1):
            raise SloError("confidence", f"{self.confidence:g} is not in (0, 1)")
        if not (1 <= self.max_steps <= MAX_STEPS_LIMIT):
            raise SloError("max_steps", f"must be in 1..{MAX_STEPS_LIMIT}")
        if not (math.isfinite(self.start) and self.start > 0):
            raise SloError("find_max_start", "must be a positive number")
        if self.kind == "concurrency" and self.start != int(self.start):
            raise SloError("find_max_start", "a concurrency is a whole number")
        if not (math.isfinite(self.max_load) and self.max_load >= self.start):
            raise SloError("find_max_limit", "must be a number >= the start")
        if not (0 < self.rate_resolution < 1):
            raise SloError("rate_resolution", "must be in (0, 1)")

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "slos": [s.to_dict() for s in self.slos],
            "confidence": self.confidence,
            "max_steps": self.max_steps,
            "start": self.start,
            "max_load": self.max_load,
            "rate_resolution": self.rate_resolution,
        }


def find_max_of(data: Mapping[str, Any]) -> FindMax:
    """The inverse of ``FindMax.to_dict`` (an API body's ``find_max``); SloError naming a
    bad field."""
    slos_in = data.get("slos")
    if not isinstance(slos_in, list):
        raise SloError("slo", "give the SLOs as a list")
    slos: list[Slo] = []
    for s in slos_in:
        if isinstance(s, str):
            slos.append(parse_slo(s))
        elif isinstance(s, Mapping):
            slos.append(make_slo(str(s.get("metric")), s.get("pct"), s.get("limit_ms")))
        else:
            raise SloError("slo", f"{s!r} is not METRIC:PCT:LIMIT")

    def num(key: str, default: float) -> float:
        v = data.get(key, default)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int | float | str):
            raise SloError(key, f"{v!r} is not a number")
        try:
            return float(v)
        except ValueError:
            raise SloError(key, f"{v!r} is not a number") from None

    kind = data.get("kind")
    steps = num("max_steps", DEFAULT_MAX_STEPS)
    if steps != int(steps):
        raise SloError("max_steps", "must be a whole number")
    return FindMax(
        kind=kind,  # type: ignore[arg-type]  # checked in __post_init__
        slos=tuple(slos),
        confidence=num("confidence", DEFAULT_CONFIDENCE),
        max_steps=int(steps),
        start=num("start", 1.0),
        max_load=num("max_load", 1024.0),
        rate_resolution=num("rate_resolution", RATE_RESOLUTION),
    )


# ------------------------------------------------------------------------- a step's checks


def upper_bound(values: F64, pct: float, confidence: float, seed: int) -> tuple[float, float]:
    """(the percentile, its one-sided upper confidence bound at ``confidence``) of the
    finite ``values`` (not empty); see the module doc."""
    x = np.sort(values[np.isfinite(values)])
    n = int(x.shape[0])
    point = float(np.percentile(x, pct))
    if n <= BOOTSTRAP_MAX_N:
        draws = bootstrap_percentiles(x, [pct], BOOTSTRAP_RESAMPLES, np.random.default_rng(seed))
        up = float(np.quantile(draws[:, 0], confidence))
    else:
        q = pct / 100.0
        z = NormalDist().inv_cdf(confidence)
        rank = math.ceil(n * q + z * math.sqrt(n * q * (1 - q))) - 1
        up = float(x[min(max(rank, 0), n - 1)])
    return point, max(up, point)


def slo_checks(
    values_ns: Mapping[str, F64], valid: BoolArr, fm: FindMax
) -> list[dict[str, object]]:
    """Each SLO of ``fm`` checked on a step's per-request values (base unit ns, by metric
    key; ``valid``: the successful sent requests): its percentile, upper bound and verdict
    (``ok`` False without samples)."""
    known = slo_metrics()
    out: list[dict[str, object]] = []
    for s in fm.slos:
        m = known[s.name]
        v = values_ns.get(m.key)
        samples = np.zeros(0) if v is None else np.asarray(v, np.float64)[valid] / m.per_unit
        samples = samples[np.isfinite(samples)]
        row: dict[str, object] = {"slo": s.text, **s.to_dict(), "samples": int(samples.size)}
        if samples.size == 0:
            row |= {"value_ms": None, "upper_ms": None, "ok": False}
        else:
            point, up = upper_bound(samples, s.pct, fm.confidence, SLO_SEED + m.seed)
            row |= {"value_ms": point, "upper_ms": up, "ok": up <= s.limit_ms}
        out.append(row)
    return out


# ------------------------------------------------------------------------------ the search


@dataclass(frozen=True, slots=True)
class Probe:
    """One probed step, as the search reads it."""

    load: float
    checks: Sequence[Mapping[str, object]]
    throughput: float | None  # successful requests per second
    error_rate: float | None
    run_id: str | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    passes: bool
    why: str


def verdict(p: Probe, prev_pass: Probe | None, max_error_rate: float) -> Verdict:
    """Whether the step passes (module doc), and why not."""
    if p.error_rate is not None and p.error_rate > max_error_rate:
        return Verdict(False, f"error rate {p.error_rate:.1%} over {max_error_rate:.1%}")
    failed = [str(c.get("slo")) for c in p.checks if not c.get("ok")]
    if failed:
        why = "SLO not held: " + ", ".join(failed)
        return Verdict(
            False,
            f"over-saturated (latency over {EXPLODED:g}x its limit); {why}" if exploded(p) else why,
        )
    if (
        prev_pass is not None
        and p.load >= MIN_GROWTH * prev_pass.load
        and p.throughput is not None
        and prev_pass.throughput
        and p.throughput < MIN_GAIN * prev_pass.throughput
    ):
        return Verdict(False, "over-saturated: throughput stopped rising")
    return Verdict(True, "every SLO held")


def exploded(p: Probe) -> bool:
    """A step whose value of an SLO is over ``EXPLODED`` x its limit (latency exploded)."""
    for c in p.checks:
        v, lim = c.get("value_ms"), c.get("limit_ms")
        if isinstance(v, float) and isinstance(lim, float) and v > EXPLODED * lim:
            return True
    return False


@dataclass(slots=True)
class Search:
    """The search's state: every probe so far and their verdicts, in order."""

    fm: FindMax
    max_error_rate: float = 0.05
    probes: list[tuple[Probe, Verdict]] = field(default_factory=list)

    def record(self, p: Probe) -> Verdict:
        # the over-saturation stop applies going up (no failing load yet), not in bisection
        prev = self._best_pass_below(p.load) if self.failing is None else None
        v = verdict(p, prev, self.max_error_rate)
        self.probes.append((p, v))
        return v

    def _best_pass_below(self, load: float) -> Probe | None:
        below = [p for p, v in self.probes if v.passes and p.load < load]
        return max(below, key=lambda p: p.load) if below else None

    @property
    def passing(self) -> float | None:
        ok = [p.load for p, v in self.probes if v.passes]
        return max(ok) if ok else None

    @property
    def failing(self) -> float | None:
        bad = [p.load for p, v in self.probes if not v.passes]
        lo = self.passing
        above = [x for x in bad if lo is None or x > lo]
        return min(above) if above else None

    def _adjacent(self, lo: float, hi: float) -> bool:
        if self.fm.kind == "concurrency":
            return hi - lo <= 1
        return hi <= lo * (1 + self.fm.rate_resolution)

    def next_load(self) -> float | None:
        """The next load to probe, or None when the search is done (module doc)."""
        if len(self.probes) >= self.fm.max_steps:
            return None
        if not self.probes:
            return self.fm.start
        lo, hi = self.passing, self.failing
        if lo is None:
            return None  # the start fails: nothing lower is searched
        if hi is None:  # still going up
            if lo >= self.fm.max_load:
                return None
            nxt = min(lo * 2, self.fm.max_load)
            return float(round(nxt)) if self.fm.kind == "concurrency" else nxt
        if self._adjacent(lo, hi):
            return None
        if self.fm.kind == "concurrency":
            return float((int(lo) + int(hi)) // 2)
        return math.sqrt(lo * hi)  # bisect in log space: rates span decades

    def stop_reason(self) -> str:
        lo, hi = self.passing, self.failing
        if lo is None:
            return f"the first load ({self.fm.start:g}) does not meet the SLOs"
        if hi is None:
            if len(self.probes) >= self.fm.max_steps and lo < self.fm.max_load:
                return f"step budget ({self.fm.max_steps}) spent going up"
            return f"every load up to {self.fm.max_load:g} met the SLOs"
        if self._adjacent(lo, hi):
            return "the interval is as narrow as asked"
        return f"step budget ({self.fm.max_steps}) spent"

    def answer(self) -> dict[str, object]:
        """The answer interval and every probe (load, verdict, checks), for reports."""
        lo, hi = self.passing, self.failing
        return {
            "kind": self.fm.kind,
            "largest_passing": lo,
            "smallest_failing": hi,
            "interval": [lo, hi],
            "steps": len(self.probes),
            "confidence": self.fm.confidence,
            "slos": [s.text for s in self.fm.slos],
            "reason": self.stop_reason(),
            "probes": [
                {
                    "load": p.load,
                    "run_id": p.run_id,
                    "passes": v.passes,
                    "why": v.why,
                    "throughput_rps": p.throughput,
                    "error_rate": p.error_rate,
                    "checks": [dict(c) for c in p.checks],
                }
                for p, v in self.probes
            ],
        }

    def text(self) -> str:
        """The answer in one line: "largest concurrency meeting the SLOs: in [12, 13]"."""
        lo, hi = self.passing, self.failing
        lo_t = "none" if lo is None else f"{lo:g}"
        hi_t = "none failed" if hi is None else f"{hi:g}"
        return (
            f"largest {self.fm.kind} meeting {', '.join(s.text for s in self.fm.slos)} "
            f"at {self.fm.confidence:g} confidence: [{lo_t}, {hi_t}] "
            f"after {len(self.probes)} steps ({self.stop_reason()})"
        )
