"""ORM rows -> API models."""

from __future__ import annotations

import datetime as dt
from typing import Any

from app.analysis.phases import send_lag_ms_of_row
from app.analysis.verdict import verdict_of
from app.api.schemas import JobInfo, RequestRow, RunSummary, TokenInfo, WorkerInfo
from app.protocol.wire import JobRequirements
from app.services.job_rules import public_spec
from app.services.runs import run_dict
from app.storage.models import ApiToken, Job, Run, Worker


def run_summary(row: Run) -> RunSummary:
    verdict = verdict_of(run_dict(row) | {"summary": row.summary or {}})
    return RunSummary(
        id=row.id,
        name=row.name,
        status=row.status,
        source=row.source,
        model=row.model,
        target_url=row.target_url,
        endpoint=row.endpoint,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        tags=list(row.tags or []),
        note=row.note,
        client_limited=bool(row.client_limited),
        lost_requests=int(row.lost_requests or 0),
        summary=dict(row.summary or {}),
        verdict=verdict.word,
        verdict_issues=[i.text for i in verdict.issues],
    )


def job_info(row: Job) -> JobInfo:
    return JobInfo(
        id=row.id,
        kind=row.kind,  # type: ignore[arg-type]
        state=row.state,  # type: ignore[arg-type]
        run_id=row.run_id,
        spec=public_spec(row.spec or {}),
        requirements=JobRequirements.model_validate(row.requirements or {}),
        attempt=row.attempt,
        max_attempts=row.max_attempts,
        worker_id=row.worker_id,
        lease_expires_at=row.lease_expires_at,
        progress=row.progress,
        cancel_requested=bool(row.cancel_requested),
        error=row.error,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        updated_at=row.updated_at,
    )


def _ms(ns: Any) -> float | None:
    return None if ns is None else float(ns) / 1e6


def request_row(r: dict[str, Any]) -> RequestRow:
    return RequestRow(
        index=r["idx"],
        warmup=bool(r["warmup"]),
        status=str(r["status"]),
        error=r["error"],
        http_status=r["http_status"],
        scheduled_ms=float(r["scheduled_ns"]) / 1e6,
        sent_ms=_ms(r["sent_ns"]),
        end_ms=_ms(r["end_ns"]),
        input_tokens=r["input_tokens"],
        output_tokens=r["output_tokens"],
        token_source=r["token_source"],
        ttft_ms=_ms(r["ttft_ns"]),
        ttfot_ms=_ms(r["ttfot_ns"]),
        e2e_ms=_ms(r["e2e_ns"]),
        tpot_ms=_ms(r["tpot_ns"]),
        n_events=int(r["n_events"] or 0),
        queued_ms=_ms(r.get("queued_ns")),
        connect_ms=_ms(r.get("connect_ns")),
        tls_ms=_ms(r.get("tls_ns")),
        sending_ms=_ms(r.get("sending_ns")),
        waiting_ms=_ms(r.get("waiting_ns")),
        first_token_ms=_ms(r.get("first_token_ns")),
        send_lag_ms=send_lag_ms_of_row(r),
        conn_id=r.get("conn_id"),
        conn_reused=r.get("conn_reused"),
        retries=int(r.get("retries") or 0),
        session=r.get("session_idx"),
        turn=r.get("turn_idx"),
        process=r.get("process_idx"),
        shard=r.get("shard_idx"),
        model=r.get("model"),
        target=r.get("target"),
        cached_prompt_tokens=r.get("cached_prompt_tokens"),
    )


def worker_info(row: Worker, *, now: dt.datetime, ttl_s: float) -> WorkerInfo:
    return WorkerInfo(
        id=row.id,
        name=row.name,
        hostname=row.hostname,
        capabilities=dict(row.capabilities or {}),
        labels=dict(row.labels or {}),
        registered_at=row.registered_at,
        last_seen_at=row.last_seen_at,
        current_job_id=row.current_job_id,
        online=(now - row.last_seen_at).total_seconds() <= ttl_s,
    )


def token_info(row: ApiToken) -> TokenInfo:
    return TokenInfo(
        id=row.id,
        name=row.name,
        scopes=list(row.scopes),
        prefix=row.prefix,
        created_at=row.created_at,
        last_used_at=row.last_used_at,
        revoked_at=row.revoked_at,
    )
