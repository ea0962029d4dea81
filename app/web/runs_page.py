"""Everything the run page shows, from one read of the run: report, profiles and figures."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.analysis.verdict import Issue, Verdict, verdict_of
from app.protocol.wire import TERMINAL_JOB_STATES
from app.services import compare as compare_svc
from app.services import hardware, run_summaries
from app.services import runs as run_svc
from app.services.client_health import client_health
from app.services.run_summaries import PROFILE_NAMES, RunSummary
from app.storage import compare_repo
from app.storage import jobs as job_repo
from app.storage import probes as probe_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.web import runs_live, runs_steady, runs_view


@dataclass(frozen=True, slots=True)
class RunData:
    run: dict[str, Any]
    summary: RunSummary  # stored for a finished run; computed per view for an active one
    job: runs_view.JobView | None
    note: str | None
    roofline: tuple[float | None, str] = (None, hardware.DEFAULT_DEVICE_TEXT)  # TPOT floor
    sweep_step: tuple[str, int] | None = None  # (sweep id, step index) of a sweep step
    telemetry_job_id: str | None = None  # the job whose device telemetry is stored
    # an active run's live panel header (``runs_live.live_progress``) and its start time as
    # the server stored it (the run's, else its job's)
    live: dict[str, Any] | None = None
    started_at: Any = None


def load_run(
    sessions: sessionmaker[Session], run_id: str, *, profile: str = "tokentrace"
) -> RunData:
    """The run row (as the report expects it), its page summary and active job.

    A finished run's summary is the stored one (``run_summaries.page_summary``: no event
    decoded; recomputed and stored when missing or stale). An active run's is computed
    from its events now, with only the profiles this view shows. Raises
    ``run_svc.RunNotFound``."""
    with session_scope(sessions) as s:
        row = repo.find_run(s, run_id)
        if row is None:
            raise run_svc.RunNotFound(run_id)
        run = run_svc.run_dict(row)
        note = row.note
        job = job_repo.job_for_run(s, run_id)
        floor = hardware.roofline_floor(s, run_id, row.load_stats)
        job_v = (
            runs_view.job_view(job)
            if job is not None and job.state not in TERMINAL_JOB_STATES
            else None
        )
        step = compare_repo.step_of_run(s, run_id)
        sweep_step = (step.sweep_id, step.step_idx) if step is not None else None
        tele = _telemetry_job(s, job.id if job is not None else None, sweep_step)
        active = job_v is not None or str(row.status) in runs_view.ACTIVE_RUN_STATES
        live = None
        header: dict[str, Any] | None = None
        if active:
            wanted = ("tokentrace", profile) if profile != "tokentrace" else ()
            live = run_summaries.compute_summary(s, run_id, profiles=wanted)
            header = runs_live.live_progress(
                str(row.status),
                job.state if job is not None else None,
                runs_live.measured_planned(row, job),
                live.n_requests if live is not None else 0,
            )
        started = runs_live.started_at(row, job)
    summary = live if live is not None else run_summaries.page_summary(sessions, run_id)
    return RunData(run, summary, job_v, note, floor, sweep_step, tele, header, started)


def _telemetry_job(
    s: Session, job_id: str | None, sweep_step: tuple[str, int] | None
) -> str | None:
    """The run's job when it has telemetry; for a sweep step, else the sweep's job."""
    if job_id is not None and probe_repo.has_telemetry(s, job_id):
        return job_id
    if sweep_step is not None:
        sweep = compare_repo.find_sweep(s, sweep_step[0])
        if sweep is not None and sweep.job_id and probe_repo.has_telemetry(s, sweep.job_id):
            return sweep.job_id
    return None


def build_report(
    data: RunData, *, slos_ms: dict[str, float] | None, profile: str | None
) -> dict[str, Any]:
    """The run's report (``app.services.runs.summary_report``) for these SLOs/profile."""
    return run_svc.summary_report(
        data.run,
        data.summary,
        slos_ms=slos_ms,
        profile=profile if profile in PROFILE_NAMES else None,
    )


def figures_json(data: RunData) -> dict[str, str]:
    """Each figure as a JSON string for a ``<script type="application/json">`` block."""
    imported = str(data.run.get("source") or "").startswith("import")
    return {
        key: fig
        for key, fig in data.summary.figures.items()
        # an import has no schedule to lag behind, nor a queue to wait in
        if not (imported and key in ("send_lag", "queue_wait"))
    }


def report_verdict(run: dict[str, Any], report: dict[str, Any]) -> Verdict:
    """The run's verdict (``app.analysis.verdict``) on its report's request counts: the
    same function and inputs as the report's own ``validity.verdict``."""
    requests = (report.get("metrics") or {}).get("requests")
    return verdict_of(run, requests if isinstance(requests, dict) else None)


def report_warnings(run: dict[str, Any], report: dict[str, Any]) -> list[Issue]:
    """Why a run's figures cannot be taken as they stand: its verdict's flagged issues
    (none while it is pending)."""
    v = report_verdict(run, report)
    return [] if v.pending else list(v.flagged)


def run_context(
    data: RunData,
    *,
    slos_ms: dict[str, float] | None,
    slo_errors: dict[str, str],
    profile: str,
) -> dict[str, Any]:
    """The template context of the run page."""
    report = build_report(data, slos_ms=slos_ms, profile=None)
    comparison: list[runs_view.ProfileRow] = []
    profile_notes: list[str] = []
    summary = data.summary
    if profile != "tokentrace" and profile in PROFILE_NAMES and summary.n_requests:
        ours = summary.profiles["tokentrace"]
        theirs = summary.profiles[profile]
        comparison = runs_view.profile_rows(ours, theirs)
        notes = theirs.get("notes")
        profile_notes = [str(n) for n in notes] if isinstance(notes, list) else []
    spec = report.get("spec") or {}
    metrics = report["metrics"]
    active = data.job is not None or str(data.run.get("status")) in runs_view.ACTIVE_RUN_STATES
    verdict = report_verdict(data.run, report)
    requests = metrics.get("requests") or {}
    return {
        "run": data.run,
        "note": data.note,
        "report": report,
        "cards": runs_view.summary_cards(
            report, verdict, active=active, job_state=data.job.state if data.job else None
        ),
        "verdict": verdict,
        # the banners: what makes the figures untrustworthy, and the notices (cancelled,
        # not finished), both from the verdict the validity card shows
        "warnings": list(verdict.untrusted),
        "notices": list(verdict.notices),
        "active": active,
        # charts only once something succeeded (no empty charts while a run has no data)
        "has_data": bool(requests.get("completed_ok")),
        "client_health": client_health(report),
        "rows": runs_view.metric_rows(report),
        "steady": runs_steady.steady_view(report),
        "pcts": runs_view.PCTS,
        "profile": profile,
        "profiles": runs_view.PROFILE_LABELS,
        "comparison": comparison,
        "profile_notes": profile_notes,
        "slos": metrics.get("slos_ms") or {},
        "slo_fields": runs_view.slo_fields(),
        # the distribution tabs (figure key suffix, name) and the live table's metrics
        # (column name, name): the registry's, those that apply to the run
        "dist_tabs": [(m.short_key, m.name) for m in runs_view.applying("figures", spec)],
        "live_metrics": [(m.column_name, m.name) for m in runs_view.applying("live", spec)],
        "slo_errors": slo_errors,
        "spec_json": json.dumps(spec, indent=2, sort_keys=True),
        "errors": (metrics.get("requests") or {}).get("error_reasons") or [],
        "failed_by_status": (metrics.get("requests") or {}).get("failed_by_status") or {},
        "figures": figures_json(data),
        "job": data.job,
        "live": data.live,
        "started_at": data.started_at,
        "sweep_step": data.sweep_step,
        "telemetry_job_id": data.telemetry_job_id,
        "n_requests": summary.n_requests,
        "n_events": summary.n_events,
        "summary_only": summary.summary_only,
        "diagnosis": compare_svc.columns_diagnosis(
            data.run,
            summary.columns,
            report,
            weight_floor_ms=data.roofline[0],
            device=data.roofline[1],
        ),
    }
