"""Runs: execute a benchmark, store it, and build its report. Orchestrates loadgen, analysis
and storage; holds no SQL and no metric arithmetic of its own."""

from __future__ import annotations

import asyncio
import platform
import secrets
import signal
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app import __version__
from app.analysis.metric_defs import headline_cells
from app.analysis.metrics import compute_metrics, metrics_with_slos, per_request_metrics
from app.analysis.profiles import profile_metrics
from app.analysis.server_timing import beside_client
from app.analysis.steady import steady_metrics, steady_with_slos
from app.analysis.trust import (
    over_error_bound,
    spec_error_bound,
    tally,
)
from app.analysis.verdict import verdict_of
from app.client import eventloop
from app.client.datasets.base import DatasetError
from app.client.execute import execute
from app.client.load_result import LoadResult, Progress
from app.client.shards.load import run_load
from app.client.spec import RunSpec
from app.domain import ClockSource, RequestRecord, RunStatus, trace_from_records
from app.protocol.wire import RunMeta
from app.services import run_summaries, run_turns, series, server_metrics
from app.services.run_summaries import RunSummary
from app.storage import repository as repo
from app.storage.db import make_engine, session_factory, session_scope, upgrade_database
from app.storage.jsonsafe import json_safe


class RunNotFound(LookupError):
    pass


def open_database(url: str) -> sessionmaker[Session]:
    """Migrate the database to the latest schema and return a session factory."""
    upgrade_database(url)
    return session_factory(make_engine(url))


@dataclass(frozen=True)
class BenchOutcome:
    run_id: str | None
    report: dict[str, Any]
    failed: bool  # no request succeeded, or the error rate exceeded the run's bound
    status: RunStatus = RunStatus.SUCCEEDED


def store_requests(session: Session, run_id: str, records: list[RequestRecord]) -> int:
    """Store request records with their per-request summary columns; idempotent per index."""
    per_request = per_request_metrics(trace_from_records(records, include_warmup=True))
    return repo.insert_requests(session, run_id, records, per_request)


def finalize_run(
    sessions: sessionmaker[Session],
    run_id: str,
    *,
    status: RunStatus,
    meta: RunMeta | None,
    extra_notes: list[str] | None = None,
    profile: str | None = None,
    lost_requests: int | None = None,
) -> dict[str, Any]:
    """Record the run's outcome, then compute its report and cache the headline figures
    (``lost_requests``: sent or recorded but never stored; None keeps the stored count)."""
    with session_scope(sessions) as s:
        validity = list(meta.validity) if meta is not None else None
        if extra_notes:
            validity = (validity or list(repo.get_run(s, run_id).validity or [])) + extra_notes
        clock = ClockSource(meta.clock_source) if meta and meta.clock_source else None
        repo.finish_run(
            s,
            run_id,
            status=status,
            started_at=meta.started_at if meta else None,
            finished_at=datetime.now(UTC),
            start_mono_ns=meta.start_mono_ns if meta else None,
            clock_source=clock,
            client_limited=meta.client_limited if meta else None,
            validity=validity,
            load_stats=meta.load_stats if meta else None,
            lost_requests=lost_requests,
        )
    return store_summaries(sessions, run_id, profile=profile)


def store_summaries(
    sessions: sessionmaker[Session], run_id: str, *, profile: str | None = None
) -> dict[str, Any]:
    """The one step every path that ends a run takes (a job, a local bench, an import):
    decode the events once, store the run page's summary and the listing's headline, and
    return the report (under ``profile`` if given)."""
    summary = run_summaries.store_summary(sessions, run_id)
    with session_scope(sessions) as s:
        run = run_dict(repo.get_run(s, run_id))
    report = summary_report(run, summary, profile=profile)
    with session_scope(sessions) as s:
        repo.finish_run(s, run_id, summary=headline(report))
    series.settle_quietly(sessions, run_id, summary=summary)  # its series, if it named one
    return report


def _mark_failed(sessions: sessionmaker[Session] | None, run_id: str | None) -> None:
    if sessions is not None and run_id is not None:
        with session_scope(sessions) as s:
            repo.finish_run(s, run_id, status=RunStatus.FAILED)


def _forget(sessions: sessionmaker[Session] | None, run_id: str | None) -> None:
    if sessions is not None and run_id is not None:
        with session_scope(sessions) as s:
            repo.delete_run(s, run_id)


async def _load(
    spec: RunSpec,
    tag: str,
    on_progress: Callable[[Progress], None] | None,
    handle_sigint: bool,
    kernel_stamps: bool = True,
    realtime: bool = False,
) -> LoadResult:
    """Run the load; with ``handle_sigint``, Ctrl-C stops it cleanly and keeps what was measured."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if handle_sigint:
        loop.add_signal_handler(signal.SIGINT, stop.set)
    try:
        return await run_load(
            spec,
            run_tag=tag,
            on_progress=on_progress,
            stop=stop,
            kernel_stamps=kernel_stamps,
            realtime=realtime,
            read_server_counters=True,  # execute observes the run
        )
    finally:
        if handle_sigint:
            loop.remove_signal_handler(signal.SIGINT)


def execute_bench(
    spec: RunSpec,
    *,
    sessions: sessionmaker[Session] | None,
    name: str | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    handle_sigint: bool = False,
    profile: str | None = None,
    kernel_stamps: bool = True,
    realtime: bool = False,
    series_name: str | None = None,
) -> BenchOutcome:
    """Run the load here, then store the run (unless ``sessions`` is None) and report it.

    ``kernel_stamps=False`` forces user-space receive stamps; ``realtime`` runs the load thread
    at real-time priority (``app.client.sched``); ``series_name``: the named series the run
    joins (settled when it is stored)."""
    run_id: str | None = None
    if sessions is not None:
        with session_scope(sessions) as s:
            run_id = repo.create_run(
                s,
                spec,
                source="bench",
                name=name,
                status=RunStatus.RUNNING,
                client_version=__version__,
                client_host=platform.node(),
            )
            if series_name is not None:
                series.join_run(s, series_name, run_id)
    tag = run_id or secrets.token_hex(6)
    try:
        done = eventloop.run(
            execute(
                spec, lambda: _load(spec, tag, on_progress, handle_sigint, kernel_stamps, realtime)
            )
        )
    except BaseException:
        _mark_failed(sessions, run_id)
        raise
    if isinstance(done.error, DatasetError):  # refused before any request: keep no run
        _forget(sessions, run_id)
        raise done.error
    if done.result is None or done.meta is None:
        _mark_failed(sessions, run_id)
        raise done.error or RuntimeError("the load ended without a result")
    result, meta = done.result, done.meta
    status = done.status()
    failed = status is RunStatus.FAILED or over_error_bound(
        tally(result.records), spec.max_error_rate
    )
    if sessions is None or run_id is None:
        report = assemble_report(
            run={
                "id": None,
                "name": name,
                "status": status.value,
                "source": "bench",
                "spec": json_safe(spec.model_dump(mode="json")),  # as a stored run has it
                "clock_source": meta.clock_source,
                "client_limited": meta.client_limited,
                "client_host": meta.client_host,
                "validity": meta.validity,
                "load_stats": meta.load_stats,
                "summary_only": False,
                "started_at": result.start_wall.isoformat(),
                "finished_at": datetime.now(UTC).isoformat(),
            },
            records=result.records,
            clock_source=result.clock_source,
            profile=profile,
        )
        return BenchOutcome(None, report, failed, status)
    with session_scope(sessions) as s:
        store_requests(s, run_id, result.records)
        server_metrics.store(s, run_id, done.series)
    lost = result.counts.get("lost") or None  # a load process that died (app.client.shards)
    report = finalize_run(
        sessions, run_id, status=status, meta=meta, profile=profile, lost_requests=lost
    )
    return BenchOutcome(run_id, report, failed, status)


def assemble_report(
    *,
    run: dict[str, Any],
    records: list[RequestRecord] | None = None,
    trace: Any = None,
    clock_source: ClockSource = ClockSource.USERSPACE,
    slos_ms: dict[str, float] | None = None,
    profile: str | None = None,
) -> dict[str, Any]:
    """The whole report: run facts, validity, counts and every metric (units in keys)."""
    if trace is None:
        assert records is not None
        trace = trace_from_records(
            records, summary_only=bool(run.get("summary_only")), clock_source=clock_source
        )
    spec = run.get("spec") or {}
    slos = slos_ms if slos_ms is not None else dict(spec.get("goodput") or {})
    metrics = compute_metrics(trace, slos_ms=slos).to_dict()
    block = None
    if profile is not None:
        block = {"name": profile, **profile_metrics(trace, profile).to_dict()}
    report = _compose(run, spec, slos, metrics, block)
    report["steady"] = steady_metrics(trace, spec, slos_ms=slos)
    return report


def summary_report(
    run: dict[str, Any],
    summary: RunSummary,
    *,
    slos_ms: dict[str, float] | None = None,
    profile: str | None = None,
) -> dict[str, Any]:
    """``assemble_report`` from a run's page summary: the same report, no event read."""
    spec = run.get("spec") or {}
    slos = slos_ms if slos_ms is not None else dict(spec.get("goodput") or {})
    c = summary.columns
    metrics = metrics_with_slos(summary.metrics, c.values, c.valid, slos)
    block = None
    if profile is not None:
        found = summary.profiles.get(profile)
        if found is None:
            raise ValueError(f"the run's summary has no {profile!r} profile")
        block = {"name": profile, **found}
    report = _compose(run, spec, slos, metrics, block)
    report["steady"] = steady_with_slos(summary.steady, c.sent_ns, c.values, c.valid, slos)
    return report


def _compose(
    run: dict[str, Any],
    spec: dict[str, Any],
    slos: dict[str, float],
    metrics: dict[str, Any],
    profile_block: dict[str, Any] | None,
) -> dict[str, Any]:
    bound = spec_error_bound(spec)
    requests = metrics.get("requests")
    err = requests.get("error_rate") if isinstance(requests, dict) else None
    over = isinstance(err, float) and err > bound
    lost = int(run.get("lost_requests") or 0)
    verdict = verdict_of(run, requests if isinstance(requests, dict) else None)
    report: dict[str, Any] = {
        "run_id": run.get("id"),
        "name": run.get("name"),
        "status": run.get("status"),
        "source": run.get("source"),
        "started_at": run.get("started_at"),
        "finished_at": run.get("finished_at"),
        "client_version": run.get("client_version", __version__),
        "client_host": run.get("client_host"),
        "clock_source": run.get("clock_source"),
        "spec": spec,
        "validity": {
            "valid": verdict.valid,
            "verdict": verdict.word,  # app.analysis.verdict: the one word every surface shows
            "tone": verdict.tone,
            "detail": verdict.detail,
            "issues": [i.to_dict() for i in verdict.issues],
            "client_limited": bool(run.get("client_limited")),
            "lost_requests": lost,
            "over_error_bound": over,
            "max_error_rate": bound,
            "notes": list(run.get("validity") or []),
            "summary_only": bool(run.get("summary_only")),
        },
        "load": run.get("load_stats") or {},
        "slos_ms": slos,
        "metrics": metrics,
    }
    scrape = (run.get("load_stats") or {}).get("server_metrics")
    timing = scrape.get("timing") if isinstance(scrape, dict) else None
    if isinstance(timing, dict):
        report["server_timing"] = beside_client(timing, metrics)
    turns = (run.get("load_stats") or {}).get("turns")
    if isinstance(turns, list):  # multi-turn sessions: metrics by turn index
        report["turns"] = turns
    groups = (run.get("load_stats") or {}).get("groups")
    if isinstance(groups, dict) and groups:  # several models / targets: metrics by each
        report["groups"] = groups
    if profile_block is not None:
        report["profile"] = profile_block
    return report


def run_dict(row: Any) -> dict[str, Any]:
    def iso(v: datetime | None) -> str | None:
        return v.isoformat() if v is not None else None

    return {
        "id": row.id,
        "name": row.name,
        "status": row.status,
        "source": row.source,
        "spec": row.spec,
        "clock_source": row.clock_source,
        "client_version": row.client_version,
        "client_host": row.client_host,
        "client_limited": row.client_limited,
        "lost_requests": row.lost_requests,
        "validity": row.validity,
        "load_stats": row.load_stats,
        "summary_only": row.summary_only,
        "started_at": iso(row.started_at),
        "finished_at": iso(row.finished_at),
        "created_at": iso(row.created_at),
        "tags": row.tags,
    }


def run_report(
    sessions: sessionmaker[Session],
    run_id: str,
    *,
    profile: str | None = None,
    slos_ms: dict[str, float] | None = None,
) -> dict[str, Any]:
    """A stored run's report: a finished run's from its page summary (no event decoded;
    computed and stored first if missing or stale), an active run's (or one under a profile
    the summary does not hold) recomputed from its event log."""
    with session_scope(sessions) as s:
        try:
            row = repo.get_run(s, run_id)
        except repo.NotFoundError:
            raise RunNotFound(run_id) from None
        run = run_dict(row)
        stored = row.status not in (RunStatus.QUEUED, RunStatus.RUNNING) and (
            profile is None or profile in run_summaries.STORED_PROFILES
        )
        trace = None if stored else repo.load_trace(s, run_id)
    if trace is None:
        summary = run_summaries.page_summary(sessions, run_id)
        report = summary_report(run, summary, slos_ms=slos_ms, profile=profile)
    else:
        report = assemble_report(run=run, trace=trace, slos_ms=slos_ms, profile=profile)
    if "turns" not in report and run_turns.is_multi_turn(run):  # stored without its table
        with session_scope(sessions) as s:
            table = run_turns.turn_table_of_run(s, run_id, run)
        if table:
            report["turns"] = table
    return report


def headline(report: dict[str, Any]) -> dict[str, Any]:
    """The few figures cached on the run row for listings: each metric's ``headline``
    statistics (``headline_cells``), the counts and the server's own timing."""
    m = report["metrics"]
    server = report.get("server_timing") or {}

    def cell(key: str, stat: str) -> Any:
        d = m.get(key)
        if stat == "value":
            return d
        return d.get(stat) if isinstance(d, dict) else None

    return {
        **{name: cell(metric.key, stat) for metric, stat, name in headline_cells()},
        "error_rate": m.get("error_rate"),
        "sent": (m.get("requests") or {}).get("sent"),
        "completed": (m.get("requests") or {}).get("completed_ok"),
        "failed": (m.get("requests") or {}).get("failed"),
        "cancelled": (m.get("requests") or {}).get("cancelled"),
        "server_prefill_ms_per_request": server.get("server_prefill_ms_per_request"),
        "server_decode_ms_per_token": server.get("server_decode_ms_per_token"),
    }


def list_runs(sessions: sessionmaker[Session], *, limit: int = 50) -> list[dict[str, Any]]:
    with session_scope(sessions) as s:
        rows = repo.list_runs(s, limit=limit, offset=0)
        runs = [run_dict(r) | {"summary": r.summary or {}} for r in rows]
    return [r | {"verdict": verdict_of(r).to_dict()} for r in runs]
