"""Read-only SQL for browsing a run's requests page by page (summary columns, no events)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.storage.models import Request

SUMMARY_COLUMNS = (
    "idx",
    "warmup",
    "status",
    "error",
    "http_status",
    "scheduled_ns",
    "sent_ns",
    "end_ns",
    "input_tokens",
    "output_tokens",
    "cached_prompt_tokens",
    "token_source",
    "ttft_ns",
    "ttfot_ns",
    "e2e_ns",
    "tpot_ns",
    "metric_values",
    "n_events",
    "queued_ns",
    "connect_ns",
    "tls_ns",
    "sending_ns",
    "waiting_ns",
    "first_token_ns",
    "conn_id",
    "conn_reused",
    "retries",
    "session_idx",
    "turn_idx",
    "process_idx",
    "shard_idx",
    "model",
    "target",
)


def request_rows(session: Session, run_id: str, *, limit: int, offset: int) -> list[dict[str, Any]]:
    """One dict per request (ordered by index) with the ``SUMMARY_COLUMNS``."""
    t = Request.__table__
    stmt = (
        select(*(t.c[c] for c in SUMMARY_COLUMNS))
        .where(t.c.run_id == run_id)
        .order_by(t.c.idx)
        .limit(limit)
        .offset(offset)
    )
    return [dict(r._mapping) for r in session.execute(stmt)]


def request_sent_ns(session: Session, run_id: str, idx: int) -> tuple[bool, int | None]:
    """(exists, sent_ns) of one request."""
    row = session.execute(
        select(Request.sent_ns).where(Request.run_id == run_id, Request.idx == idx)
    ).first()
    return (False, None) if row is None else (True, row[0])
