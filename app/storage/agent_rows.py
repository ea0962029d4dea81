"""Read-only SQL for an agent trace's requests (``app.analysis.agent_sessions``): one
session's summary columns and their links (``requests.metric_values``), no event read."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.analysis.agent_sessions import AgentRow
from app.domain import AgentLink, RequestStatus
from app.storage.models import Request


def session_rows(
    session: Session, run_id: str, agent_session: int
) -> tuple[list[AgentRow], dict[int, int]]:
    """The measured requests of session ``agent_session`` that carry a link, in index
    order, and each one's position in its session (``turn_idx``) by index."""
    t = Request.__table__
    stmt = (
        select(
            t.c.idx,
            t.c.turn_idx,
            t.c.scheduled_ns,
            t.c.sent_ns,
            t.c.end_ns,
            t.c.status,
            t.c.ttft_ns,
            t.c.metric_values,
        )
        .where(t.c.run_id == run_id, t.c.warmup.is_(False), t.c.session_idx == agent_session)
        .order_by(t.c.idx)
    )
    rows: list[AgentRow] = []
    turns: dict[int, int] = {}
    for idx, turn, scheduled, sent, end, status, ttft, values in session.execute(stmt):
        link = AgentLink.from_values(values)
        if link is None:
            continue
        ok = status == RequestStatus.OK.value
        ttft_ns = float(ttft) if ttft is not None else float("nan")
        rows.append(AgentRow(int(idx), agent_session, int(scheduled), sent, end, ok, ttft_ns, link))
        if turn is not None:
            turns[int(idx)] = int(turn)
    return rows, turns
