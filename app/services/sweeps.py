"""Sweeps (SPEC §3): the same workload at several loads, run here step by step, each step a
normal stored run linked to its sweep; stops early when the server saturates."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.analysis import diagnosis
from app.analysis.metric_defs import TPOT
from app.analysis.slo_search import FindMax, Search, find_max_of
from app.analysis.sweep import (
    DEFAULT_MAX_ERROR_RATE,
    LoadKind,
    StepSummary,
    max_goodput,
)
from app.analysis.verdict import run_trust_issues
from app.client.spec import RunSpec
from app.client.sweep_plan import (
    SweepPlan,
    drive,
    probe_of,
    step_dict,
    step_label,
    step_spec,
    step_summary,
    step_summary_of,
)
from app.domain import RunStatus
from app.services import hardware, run_summaries
from app.services import runs as run_svc
from app.services.errors import Conflict, Invalid, NotFound
from app.storage import compare_repo
from app.storage import jobs as job_repo
from app.storage import repository as repo
from app.storage.db import session_scope


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
        find_max: FindMax | None = None,
    ) -> None:
        self.find_max = find_max
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
        return step_summary(idx, load, kind, out.report, trace, out.run_id, self.find_max)

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
            s,
            spec=spec.model_dump(mode="json"),
            mode=plan.mode,
            loads=list(plan.loads),
            name=name,
            find_max=None if plan.find_max is None else plan.find_max.to_dict(),
        )
    runner = _Runner(sessions, spec, sweep_id, name or f"sweep {sweep_id}", on_step, plan.find_max)
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


def sweep_summary(
    sessions: sessionmaker[Session],
    sweep_id: str,
    *,
    slos_ms: dict[str, float] | None = None,
    steady: bool = False,
) -> dict[str, Any]:
    """The sweep, its steps (from each step run's report), max goodput and diagnosis. A
    finished step is read from its stored run summary (no event decoded). ``slos_ms`` (p99
    limits by ``ttft``/``tpot``/``e2el``) replace the sweep's own goodput SLOs for max
    goodput (``{}``: none); None keeps the spec's. ``steady``: each step's figures over its
    run's steady window (``analysis.steady``: the requests started inside it; a step
    without one keeps its whole run's and says so in ``steady_missing``); the summary says
    ``basis: steady``."""
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
            # each step one run dealt over this many workers (the server sequences them)
            "shards": int((sweep.spec or {}).get("shards") or 1),
            "tags": list(sweep.tags or []),
            "note": sweep.note,
        }
        fm_data = sweep.find_max
        rows = [
            (st.step_idx, st.run_id, st.load, st.load_kind, st.role, st.attempt)
            for st in compare_repo.sweep_steps(s, sweep_id)
        ]
    steps: list[StepSummary] = []
    untrusted: dict[int, list[str]] = {}  # index in steps -> why its run is untrusted
    out_steps: list[dict[str, Any]] = []
    floors: dict[str, tuple[float | None, str]] = {}
    resumed: dict[int, int] = {}  # job attempt >= 2 -> the first step it ran
    fm = find_max_of(fm_data) if isinstance(fm_data, dict) else None
    missing: list[int] = []  # steps without a steady window (steady basis)
    for idx, run_id, load, kind, role, attempt in rows:
        if attempt > 1:
            resumed.setdefault(attempt, idx)
        with session_scope(sessions) as s:
            row = repo.get_run(s, run_id)
            run = run_svc.run_dict(row)
            cached = dict(row.summary or {})
            floors[run_id] = hardware.roofline_floor(s, run_id, row.load_stats)
            live = None  # a step still running: summarized now (as its run page does)
            if row.status in (RunStatus.QUEUED, RunStatus.RUNNING):
                live = run_summaries.compute_summary(s, run_id, profiles=())
        summary = live if live is not None else run_summaries.page_summary(sessions, run_id)
        report = run_svc.summary_report(run, summary)
        real_load = math.inf if load < 0 else load
        c = summary.columns
        requests = (c.sent_ns, c.end_ns, c.valid)
        values = c.values
        window = (report.get("steady") or {}).get("window") if steady else None
        if isinstance(window, dict):
            keep = (c.sent_ns >= window["start_ns"]) & (c.sent_ns <= window["end_ns"])
            report = report | {"metrics": report["steady"]["metrics"]}
            requests = (c.sent_ns[keep], c.end_ns[keep], c.valid[keep])
            values = {k: v[keep] for k, v in values.items()}
        elif steady:
            missing.append(idx)
        summ = step_summary_of(
            idx,
            real_load,
            kind,  # type: ignore[arg-type]
            report,
            requests,
            run_id,
            values=values if fm is not None else None,
            find_max=fm,
        )
        out_steps.append(
            step_dict(summ, role) | {"status": str(run.get("status")), "attempt": attempt}
        )
        if role == "step":
            issues = run_trust_issues(run | {"summary": cached}, error_rate=summ.error_rate)
            if issues:
                untrusted[len(steps)] = issues
            steps.append(summ)
    slos = dict((info["spec"] or {}).get("goodput") or {}) if slos_ms is None else dict(slos_ms)
    best = max_goodput(steps, slos, untrusted=untrusted)
    if fm is not None:  # the search replayed on the stored steps: the answer so far
        search = Search(fm, DEFAULT_MAX_ERROR_RATE)
        for st in steps:
            search.record(probe_of(st))
        info["find_max"] = {"config": fm.to_dict(), **search.answer(), "text": search.text()}
    info.update(
        basis="steady" if steady else "run",
        steady_missing=missing,
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
    note = diagnosis.decode_memory_bound(lowest.latency(TPOT.key, "p50"), floor_ms, device=device)
    return [] if note is None else [note]


# ------------------------------------------------------------------ tags, note, delete

MAX_NOTE = 100_000  # characters, as a run's note


def set_tags(session: Session, sweep_id: str, tags: list[str]) -> list[str]:
    """Replace a sweep's tags by the run tags' rule (each 1 to 100 characters, trimmed,
    de-duplicated); 404 when there is no such sweep, 422 naming a bad tag."""
    if any("\x00" in t for t in tags):
        raise Invalid("tags: a tag must not contain a NUL byte", loc=("body", "tags"))
    try:
        return compare_repo.set_sweep_tags(session, sweep_id, tags)
    except KeyError:
        raise NotFound(f"no sweep with id {sweep_id!r}") from None
    except (ValueError, TypeError) as e:
        raise Invalid(f"tags: {e}", loc=("body", "tags")) from None


def set_note(session: Session, sweep_id: str, note: str | None) -> None:
    """Replace a sweep's note (blank or None clears it); 422 over ``MAX_NOTE`` characters."""
    clean = (note or "").strip()
    if len(clean) > MAX_NOTE:
        raise Invalid(f"note: at most {MAX_NOTE:,} characters", loc=("body", "note"))
    if "\x00" in clean:
        raise Invalid("note: must not contain a NUL byte", loc=("body", "note"))
    try:
        compare_repo.set_sweep_note(session, sweep_id, clean or None)
    except KeyError:
        raise NotFound(f"no sweep with id {sweep_id!r}") from None


@dataclass(frozen=True, slots=True)
class SweepContents:
    """What deleting a sweep removes, for its confirmation page."""

    sweep_id: str
    run_ids: list[str]  # its steps' runs (probe steps included)
    n_requests: int  # stored requests of those runs
    baselines: list[str]  # current baseline names pointing at the sweep or one of its runs


def contents(session: Session, sweep_id: str) -> SweepContents:
    if compare_repo.find_sweep(session, sweep_id) is None:
        raise NotFound(f"no sweep with id {sweep_id!r}")
    run_ids = [st.run_id for st in compare_repo.sweep_steps(session, sweep_id)]
    ids = set(run_ids)
    names = [
        b.name
        for b in compare_repo.list_baselines(session)
        if b.sweep_id == sweep_id or (b.run_id is not None and b.run_id in ids)
    ]
    n = sum(repo.count_requests(session, rid) for rid in run_ids)
    return SweepContents(sweep_id, run_ids, n, names)


def delete_sweep(session: Session, sweep_id: str) -> SweepContents:
    """Delete a sweep with its steps' runs (their requests and events) and its job; what
    it removed. 409 while a worker runs it (cancel it first); a queued sweep's job is
    cancelled first, so that no worker leases it meanwhile. Baselines that pointed at the
    sweep or its runs are kept, pointing at nothing (their history says so)."""
    sweep = compare_repo.find_sweep(session, sweep_id)
    if sweep is None:
        raise NotFound(f"no sweep with id {sweep_id!r}")
    job = job_repo.get_job(session, sweep.job_id) if sweep.job_id else None
    if job is not None and job.state in job_repo.ACTIVE_STATES:
        raise Conflict(f"sweep {sweep_id!r} is {job.state} on a worker: cancel it first")
    if (
        job is not None
        and job.state == "queued"
        and not job_repo.transition(session, job.id, from_states=("queued",), state="cancelled")
    ):
        raise Conflict(f"sweep {sweep_id!r} was just leased by a worker: cancel it first")
    gone = contents(session, sweep_id)
    for run_id in gone.run_ids:
        job_repo.delete_jobs_of_run(session, run_id)
        repo.delete_run(session, run_id)
    compare_repo.delete_sweep(session, sweep_id)
    return gone
