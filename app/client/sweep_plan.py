"""A sweep's plan and how it is driven (SPEC §3): the loads, the auto mode's probes, the step
specs and labels, the early stop at saturation, and a step's summary. Pure: the steps run
through a ``StepRunner`` (here on the dashboard's machine, or on a worker over the protocol).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from app.analysis.metric_defs import GOODPUT, OUTPUT_THROUGHPUT, REQUEST_THROUGHPUT, shown
from app.analysis.sweep import (
    DEFAULT_MAX_ERROR_RATE,
    DEFAULT_MIN_RATIO,
    LoadKind,
    StepSummary,
    achieved_rate,
    auto_rates,
    saturation_reason,
)
from app.client.spec import RunSpec
from app.domain import RunTrace

I64 = npt.NDArray[np.int64]
BoolArr = npt.NDArray[np.bool_]

SweepMode = Literal["rates", "concurrencies", "auto"]
MAX_STEPS = 32


@dataclass(frozen=True, slots=True)
class SweepPlan:
    mode: SweepMode
    loads: tuple[float, ...] = ()  # rates (req/s) or concurrencies; empty for auto
    auto_steps: int = 5  # auto: rates between the synchronous and max-throughput runs
    min_ratio: float = DEFAULT_MIN_RATIO
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE

    def __post_init__(self) -> None:
        if self.mode == "auto":
            if self.loads:
                raise ValueError("loads: an auto sweep chooses its own loads")
            if not 1 <= self.auto_steps <= MAX_STEPS:
                raise ValueError(f"auto_steps must be in 1..{MAX_STEPS}")
        else:
            if not 1 <= len(self.loads) <= MAX_STEPS:
                raise ValueError(f"loads: give 1 to {MAX_STEPS} loads")
            if any(not (x > 0 and math.isfinite(x)) for x in self.loads):
                raise ValueError("loads: every load must be a positive finite number")
            if self.mode == "concurrencies" and any(x != int(x) for x in self.loads):
                raise ValueError("loads: concurrencies must be whole numbers")
            if list(self.loads) != sorted(set(self.loads)):
                raise ValueError("loads: give distinct loads in increasing order")
        if not 0 < self.min_ratio <= 1:
            raise ValueError("min_ratio must be in (0, 1]")
        if not 0 <= self.max_error_rate <= 1:
            raise ValueError("max_error_rate must be in [0, 1]")

    @property
    def load_kind(self) -> LoadKind:
        return "concurrency" if self.mode == "concurrencies" else "rate"


def step_spec(spec: RunSpec, load: float, kind: LoadKind) -> RunSpec:
    """The base spec at one load: a request rate, or a concurrency with all sent at once."""
    if kind == "rate":
        update: dict[str, Any] = {"request_rate": float(load)}
    else:
        update = {"max_concurrency": int(load), "request_rate": math.inf}
    return RunSpec.model_validate(spec.model_dump() | update | {"api_key": spec.api_key})


def step_label(load: float, kind: LoadKind) -> str:
    if math.isinf(load):
        return "max throughput"
    return f"{load:g} req/s" if kind == "rate" else f"concurrency {load:g}"


def step_summary(
    index: int,
    load: float,
    kind: LoadKind,
    report: dict[str, Any],
    trace: RunTrace,
    run_id: str | None,
) -> StepSummary:
    return step_summary_of(
        index, load, kind, report, (trace.sent_ns, trace.end_ns, trace.ok), run_id
    )


def step_summary_of(
    index: int,
    load: float,
    kind: LoadKind,
    report: dict[str, Any],
    requests: tuple[I64, I64, BoolArr],
    run_id: str | None,
) -> StepSummary:
    """``step_summary`` from the step run's per-request (sent_ns, end_ns, ok) alone (a
    stored run summary's columns: ``valid`` serves as ``ok``, the rate reads both alike)."""
    sent_ns, end_ns, ok = requests
    m = report["metrics"]
    lat = {
        md.key: {p: (m.get(md.key) or {}).get(p) for p in ("p50", "p90", "p99")}
        for md in shown("sweep")
    }
    return StepSummary(
        index=index,
        load=float(load),
        load_kind=kind,
        achieved_rps=achieved_rate(
            sent_ns,
            end_ns,
            ok,
            closed_loop=kind == "concurrency" or math.isinf(load),
        ),
        request_throughput_rps=m.get(REQUEST_THROUGHPUT.key),
        output_throughput_tok_s=m.get(OUTPUT_THROUGHPUT.key),
        goodput_rps=m.get(GOODPUT.key),
        error_rate=m.get("error_rate"),
        latency_ms=lat,
        run_id=run_id,
    )


def step_dict(s: StepSummary, role: str = "step") -> dict[str, Any]:
    return {
        "index": s.index,
        "run_id": s.run_id,
        "load": s.load if math.isfinite(s.load) else None,  # None: max-throughput probe
        "load_kind": s.load_kind,
        "role": role,
        "achieved_rps": s.achieved_rps,
        "request_throughput_rps": s.request_throughput_rps,
        OUTPUT_THROUGHPUT.key: s.output_throughput_tok_s,
        "goodput_rps": s.goodput_rps,
        "error_rate": s.error_rate,
        "latency_ms": {k: dict(v) for k, v in s.latency_ms.items()},
    }


def step_from_dict(d: dict[str, Any]) -> StepSummary:
    """The inverse of ``step_dict`` (a null load is the unlimited-rate probe)."""
    load = d.get("load")
    return StepSummary(
        index=int(d["index"]),
        load=math.inf if load is None else float(load),
        load_kind=d["load_kind"],
        achieved_rps=d.get("achieved_rps"),
        request_throughput_rps=d.get("request_throughput_rps"),
        output_throughput_tok_s=d.get(OUTPUT_THROUGHPUT.key),
        goodput_rps=d.get("goodput_rps"),
        error_rate=d.get("error_rate"),
        latency_ms=d.get("latency_ms") or {},
        run_id=d.get("run_id"),
    )


class StepRunner(Protocol):
    """Runs one step of a sweep and stores it (here, or on a server for a worker)."""

    def run(self, load: float, kind: LoadKind, role: str) -> StepSummary: ...

    def set_loads(self, loads: list[float]) -> None: ...


def drive(runner: StepRunner, plan: SweepPlan) -> str | None:
    """Run the plan's steps in order through ``runner``; the reason it stopped early, or
    None when every planned step ran."""
    return _auto(runner, plan) if plan.mode == "auto" else _fixed(runner, plan)


def planned_steps(plan: SweepPlan) -> int:
    return 2 + plan.auto_steps if plan.mode == "auto" else len(plan.loads)


def _fixed(runner: StepRunner, plan: SweepPlan) -> str | None:
    done: list[StepSummary] = []
    for load in plan.loads:
        done.append(runner.run(load, plan.load_kind, "step"))
        reason = saturation_reason(
            done, min_ratio=plan.min_ratio, max_error_rate=plan.max_error_rate
        )
        if reason is not None and len(done) < len(plan.loads):
            return f"stopped early: {reason}"
    return None


def _auto(runner: StepRunner, plan: SweepPlan) -> str | None:
    sync = runner.run(1, "concurrency", "probe")
    peak = runner.run(math.inf, "rate", "probe")
    lo, hi = sync.request_throughput_rps, peak.request_throughput_rps
    if not lo or not hi:
        return "stopped: the synchronous or max-throughput run measured no throughput"
    rates = auto_rates(lo, hi, plan.auto_steps + 2)[1:-1] if hi > lo else [lo]
    runner.set_loads(rates)
    return _fixed(runner, SweepPlan("rates", tuple(rates), 1, plan.min_ratio, plan.max_error_rate))


def plan_dict(plan: SweepPlan) -> dict[str, Any]:
    return {
        "mode": plan.mode,
        "loads": list(plan.loads),
        "auto_steps": plan.auto_steps,
        "min_ratio": plan.min_ratio,
        "max_error_rate": plan.max_error_rate,
    }


def plan_of(data: dict[str, Any]) -> SweepPlan:
    """Raises ValueError for a plan that is not valid."""
    return SweepPlan(
        data["mode"],
        tuple(float(x) for x in data.get("loads") or ()),
        int(data.get("auto_steps") or 5),
        float(data.get("min_ratio") or DEFAULT_MIN_RATIO),
        float(data.get("max_error_rate", DEFAULT_MAX_ERROR_RATE)),
    )
