"""Sweeps (SPEC §3): the same workload at several loads, run here step by step, each step a
normal stored run linked to its sweep; stops early when the server saturates."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from sqlalchemy.orm import Session, sessionmaker

from app.analysis import diagnosis
from app.analysis.sweep import (
    DEFAULT_MAX_ERROR_RATE,
    DEFAULT_MIN_RATIO,
    LoadKind,
    StepSummary,
    achieved_rate,
    auto_rates,
    max_goodput,
    saturation_reason,
)
from app.analysis.trust import run_trust_issues
from app.domain import RunSpec, RunTrace
from app.services import hardware
from app.services import runs as run_svc
from app.services.errors import NotFound
from app.storage import compare_repo
from app.storage import repository as repo
from app.storage.db import session_scope

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
    m = report["metrics"]
    lat = {
        k: {p: (m.get(k) or {}).get(p) for p in ("p50", "p90", "p99")}
        for k in ("ttft_ms", "tpot_ms", "e2el_ms", "itl_ms")
    }
    return StepSummary(
        index=index,
        load=float(load),
        load_kind=kind,
        achieved_rps=achieved_rate(
            trace.sent_ns,
            trace.end_ns,
            trace.ok,
            closed_loop=kind == "concurrency" or math.isinf(load),
        ),
        request_throughput_rps=m.get("request_throughput_req_s"),
        output_throughput_tok_s=m.get("output_throughput_tok_s"),
        goodput_rps=m.get("goodput_req_s"),
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
        "output_throughput_tok_s": s.output_throughput_tok_s,
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
        output_throughput_tok_s=d.get("output_throughput_tok_s"),
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


@dataclass(frozen=True, slots=True)
class SweepOutcome:
    sweep_id: str
    summary: dict[str, Any]


StepCallback = Callable[[int, float, LoadKind], None]


class _Runner:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        spec: RunSpec,
        sweep_id: str,
        name: str,
        on_step: StepCallback | None,
    ) -> None:
        self.sessions = sessions
        self.spec = spec
        self.sweep_id = sweep_id
        self.name = name
        self.on_step = on_step
        self.next_idx = 0

    def run(self, load: float, kind: LoadKind, role: str) -> StepSummary:
        idx = self.next_idx
        self.next_idx += 1
        if self.on_step is not None:
            self.on_step(idx, load, kind)
        label = step_label(load, kind)
        spec = step_spec(self.spec, load, kind)
        out = run_svc.execute_bench(spec, sessions=self.sessions, name=f"{self.name} · {label}")
        assert out.run_id is not None
        with session_scope(self.sessions) as s:
            compare_repo.add_step(
                s,
                self.sweep_id,
                step_idx=idx,
                run_id=out.run_id,
                load=load if math.isfinite(load) else -1.0,
                load_kind=kind,
                role=role,
            )
            trace = repo.load_trace(s, out.run_id)
        return step_summary(idx, load, kind, out.report, trace, out.run_id)

    def set_loads(self, loads: list[float]) -> None:
        with session_scope(self.sessions) as s:
            compare_repo.update_sweep(s, self.sweep_id, loads=loads)


def execute_sweep(
    spec: RunSpec,
    plan: SweepPlan,
    *,
    sessions: sessionmaker[Session],
    name: str | None = None,
    on_step: StepCallback | None = None,
) -> SweepOutcome:
    """Run every step here (stopping early at saturation) and store the sweep."""
    with session_scope(sessions) as s:
        sweep_id = compare_repo.create_sweep(
            s, spec=spec.model_dump(mode="json"), mode=plan.mode, loads=list(plan.loads), name=name
        )
    runner = _Runner(sessions, spec, sweep_id, name or f"sweep {sweep_id}", on_step)
    status, stop = "succeeded", None
    try:
        stop = drive(runner, plan)
    except BaseException:
        status = "failed"
        raise
    finally:
        with session_scope(sessions) as s:
            compare_repo.update_sweep(
                s, sweep_id, status=status, stop_reason=stop, finished_at=datetime.now(UTC)
            )
    return SweepOutcome(sweep_id, sweep_summary(sessions, sweep_id))


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


def sweep_summary(sessions: sessionmaker[Session], sweep_id: str) -> dict[str, Any]:
    """The sweep, its steps (from each step run's report), max goodput and diagnosis."""
    with session_scope(sessions) as s:
        sweep = compare_repo.find_sweep(s, sweep_id)
        if sweep is None:
            raise NotFound(f"no sweep with id {sweep_id!r}")
        info: dict[str, Any] = {
            "id": sweep.id,
            "name": sweep.name,
            "status": sweep.status,
            "mode": sweep.mode,
            "spec": sweep.spec,
            "loads": list(sweep.loads or []),
            "stop_reason": sweep.stop_reason,
            "created_at": sweep.created_at.isoformat(),
            "finished_at": sweep.finished_at.isoformat() if sweep.finished_at else None,
            "job_id": sweep.job_id,
        }
        rows = [
            (st.step_idx, st.run_id, st.load, st.load_kind, st.role, st.attempt)
            for st in compare_repo.sweep_steps(s, sweep_id)
        ]
    steps: list[StepSummary] = []
    untrusted: dict[int, list[str]] = {}  # index in steps -> why its run is untrusted
    out_steps: list[dict[str, Any]] = []
    floors: dict[str, tuple[float | None, str]] = {}
    resumed: dict[int, int] = {}  # job attempt >= 2 -> the first step it ran
    for idx, run_id, load, kind, role, attempt in rows:
        if attempt > 1:
            resumed.setdefault(attempt, idx)
        with session_scope(sessions) as s:
            row = repo.get_run(s, run_id)
            run = run_svc.run_dict(row)
            cached = dict(row.summary or {})
            trace = repo.load_trace(s, run_id)
            floors[run_id] = hardware.roofline_floor(s, run_id, row.load_stats)
        report = run_svc.assemble_report(run=run, trace=trace)
        real_load = math.inf if load < 0 else load
        summ = step_summary(idx, real_load, kind, report, trace, run_id)  # type: ignore[arg-type]
        out_steps.append(
            step_dict(summ, role) | {"status": str(run.get("status")), "attempt": attempt}
        )
        if role == "step":
            issues = run_trust_issues(run | {"summary": cached}, error_rate=summ.error_rate)
            if issues:
                untrusted[len(steps)] = issues
            steps.append(summ)
    slos = dict((info["spec"] or {}).get("goodput") or {})
    best = max_goodput(steps, slos, untrusted=untrusted)
    info.update(
        steps=out_steps,
        notes=[
            f"resumed after the worker was lost at step {idx} (attempt {attempt})"
            for attempt, idx in sorted(resumed.items())
        ],
        slos_ms=slos,
        max_goodput=best.to_dict(),
        diagnosis=[n.to_dict() for n in _roofline_notes(steps, floors)]
        + [n.to_dict() for n in diagnosis.sweep_notes(steps)],
    )
    return info


def _roofline_notes(
    steps: list[StepSummary], floors: dict[str, tuple[float | None, str]]
) -> list[diagnosis.Note]:
    """The roofline rule at the lowest-load step (the smallest decode batch) whose run's
    annotation gives a weight-read floor: any annotated step's floor stands for the sweep."""
    known = [f for f in floors.values() if f[0] is not None]
    if not steps or not known:
        return []
    lowest = min(steps, key=lambda s: s.load)
    floor_ms, device = floors.get(lowest.run_id or "", (None, ""))
    if floor_ms is None:
        floor_ms, device = known[0]
    note = diagnosis.decode_memory_bound(lowest.latency("tpot_ms", "p50"), floor_ms, device=device)
    return [] if note is None else [note]
