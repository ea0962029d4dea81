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
from app.analysis.metrics import basis, per_request_values
from app.analysis.slo_search import FindMax, Probe, Search, find_max_of, slo_checks
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

SweepMode = Literal["rates", "concurrencies", "auto", "find-max"]
F64 = npt.NDArray[np.float64]
MAX_STEPS = 32


@dataclass(frozen=True, slots=True)
class SweepPlan:
    mode: SweepMode
    loads: tuple[float, ...] = ()  # rates (req/s) or concurrencies; empty for auto
    auto_steps: int = 5  # auto: rates between the synchronous and max-throughput runs
    min_ratio: float = DEFAULT_MIN_RATIO
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE
    find_max: FindMax | None = None  # the find-max mode's search (app.analysis.slo_search)

    def __post_init__(self) -> None:
        if (self.mode == "find-max") != (self.find_max is not None):
            raise ValueError("find_max: the find-max mode and its search go together")
        if self.mode == "find-max":
            if self.loads:
                raise ValueError("loads: a find-max sweep chooses its own loads")
        elif self.mode == "auto":
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
        if self.find_max is not None:
            return self.find_max.kind
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
    find_max: FindMax | None = None,
) -> StepSummary:
    values = per_request_values(basis(trace, ci=False)) if find_max is not None else None
    return step_summary_of(
        index,
        load,
        kind,
        report,
        (trace.sent_ns, trace.end_ns, trace.ok),
        run_id,
        values=values,
        find_max=find_max,
    )


def step_summary_of(
    index: int,
    load: float,
    kind: LoadKind,
    report: dict[str, Any],
    requests: tuple[I64, I64, BoolArr],
    run_id: str | None,
    *,
    values: dict[str, F64] | None = None,
    find_max: FindMax | None = None,
) -> StepSummary:
    """``step_summary`` from the step run's per-request (sent_ns, end_ns, ok) alone (a
    stored run summary's columns: ``valid`` serves as ``ok``, the rate reads both alike).
    ``find_max``: the step's SLO checks from its per-request ``values`` (ns, by key)."""
    sent_ns, end_ns, ok = requests
    checks: tuple[dict[str, object], ...] = ()
    if find_max is not None:
        valid = ok & (sent_ns >= 0)
        checks = tuple(slo_checks(values or {}, valid, find_max))
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
        slo_checks=checks,
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
        "slo_checks": [dict(c) for c in s.slo_checks],
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
        slo_checks=tuple(dict(c) for c in d.get("slo_checks") or ()),
    )


class StepRunner(Protocol):
    """Runs one step of a sweep and stores it (here, or on a server for a worker)."""

    def run(self, load: float, kind: LoadKind, role: str) -> StepSummary: ...

    def set_loads(self, loads: list[float]) -> None: ...


def drive(runner: StepRunner, plan: SweepPlan) -> str | None:
    """Run the plan's steps in order through ``runner``; the reason it stopped early, or
    None when every planned step ran."""
    if plan.find_max is not None:
        return _find_max(runner, plan, plan.find_max)
    return _auto(runner, plan) if plan.mode == "auto" else _fixed(runner, plan)


def planned_steps(plan: SweepPlan) -> int:
    if plan.find_max is not None:
        return plan.find_max.max_steps  # at most
    return 2 + plan.auto_steps if plan.mode == "auto" else len(plan.loads)


def replay_search(plan: SweepPlan, steps: list[StepSummary]) -> Search | None:
    """A find-max sweep's search state after ``steps`` (its probed steps, in order), as
    the driver saw it; None for another mode."""
    if plan.find_max is None:
        return None
    search = Search(plan.find_max, plan.max_error_rate)
    for s in steps:
        search.record(probe_of(s))
    return search


def probe_of(s: StepSummary) -> Probe:
    return Probe(s.load, s.slo_checks, s.request_throughput_rps, s.error_rate, s.run_id)


def _find_max(runner: StepRunner, plan: SweepPlan, fm: FindMax) -> str | None:
    """The SLO capacity search (``app.analysis.slo_search``): each probed load a step."""
    search = Search(fm, plan.max_error_rate)
    while (load := search.next_load()) is not None:
        search.record(probe_of(runner.run(load, fm.kind, "step")))
    return search.text()


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


class _Need(Exception):
    def __init__(self, load: float, kind: LoadKind, role: str) -> None:
        super().__init__("the next step")
        self.load, self.kind, self.role = load, kind, role


class _Replayer:
    """``StepRunner`` handing back steps already run; the first one not run is wanted."""

    def __init__(self, done: list[StepSummary]) -> None:
        self.done = done
        self.used = 0
        self.loads: list[float] | None = None

    def run(self, load: float, kind: LoadKind, role: str) -> StepSummary:
        if self.used < len(self.done):
            self.used += 1
            return self.done[self.used - 1]
        raise _Need(load, kind, role)

    def set_loads(self, loads: list[float]) -> None:
        self.loads = list(loads)


@dataclass(frozen=True, slots=True)
class NextStep:
    """What a plan asks for after the steps run so far (``next_step``)."""

    load: float | None  # None: the plan ended (``reason`` says why, when early)
    kind: LoadKind
    role: str
    reason: str | None
    loads: list[float] | None  # an auto plan's rates, once it chose them


def next_step(plan: SweepPlan, done: list[StepSummary]) -> NextStep:
    """The step ``drive`` would run after ``done`` (its answers, in order), or the plan's
    end: the same rules, decided from the same summaries, wherever it is asked (a sweep
    the server sequences: each step one run dealt over workers)."""
    replay = _Replayer(done)
    try:
        reason = drive(replay, plan)
    except _Need as want:
        return NextStep(want.load, want.kind, want.role, None, replay.loads)
    return NextStep(None, plan.load_kind, "step", reason, replay.loads)


def plan_dict(plan: SweepPlan) -> dict[str, Any]:
    return {
        "mode": plan.mode,
        "loads": list(plan.loads),
        "auto_steps": plan.auto_steps,
        "min_ratio": plan.min_ratio,
        "max_error_rate": plan.max_error_rate,
        "find_max": None if plan.find_max is None else plan.find_max.to_dict(),
    }


def plan_of(data: dict[str, Any]) -> SweepPlan:
    """Raises ValueError for a plan that is not valid."""
    return SweepPlan(
        data["mode"],
        tuple(float(x) for x in data.get("loads") or ()),
        int(data.get("auto_steps") or 5),
        float(data.get("min_ratio") or DEFAULT_MIN_RATIO),
        float(data.get("max_error_rate", DEFAULT_MAX_ERROR_RATE)),
        find_max_of(fm) if isinstance(fm := data.get("find_max"), dict) else None,
    )
