"""Run-page context for an agent trace's run (datasets ``agentic``, ``otel``): the
per-session and per-depth tables kept with the run (``load_stats.agent_sessions``, from
``app.analysis.agent_sessions``) and one session as a swim-lane timeline
(``app.figures.agents``), read from its stored request rows. The session drawn is the one
the query names (``?agent_session=N``), else the one with the longest wall time. A run of
any other dataset gets ``agent_sessions`` empty and no figure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.analysis.agent_sessions import STATS_KEY
from app.figures.agents import session_timeline
from app.figures.scriptjson import plotly_json
from app.storage.agent_rows import session_rows
from app.storage.db import session_scope


def chosen_session(table: list[dict[str, Any]], asked: str | None) -> int | None:
    """The session to draw: ``asked`` when it is one of the table's, else the slowest."""
    known = {int(r["session"]) for r in table}
    if asked is not None and asked.isdigit() and int(asked) in known:
        return int(asked)
    timed = [r for r in table if isinstance(r.get("wall_ms"), int | float)]
    if not timed:
        return None
    return int(max(timed, key=lambda r: float(r["wall_ms"]))["session"])


def add_agents(
    ctx: dict[str, Any], sessions: sessionmaker[Session], run_id: str, query: Mapping[str, str]
) -> None:
    run = ctx.get("run") or {}
    load = run.get("load_stats") or {}
    stored = load.get(STATS_KEY) if isinstance(load, dict) else None
    ctx["agent_sessions"] = []
    if not isinstance(stored, dict) or not isinstance(stored.get("sessions"), list):
        return
    table = [dict(r) for r in stored["sessions"] if isinstance(r, dict)]
    ctx["agent_sessions"] = table
    ctx["agent_depths"] = [dict(r) for r in stored.get("depths") or [] if isinstance(r, dict)]
    which = chosen_session(table, query.get("agent_session"))
    ctx["agent_session_shown"] = which
    if which is None:
        return
    with session_scope(sessions) as s:
        rows, turns = session_rows(s, run_id, which)
    names = {i: f"#{t}" for i, t in turns.items()}
    fig = session_timeline(rows, f"session {which}", names)
    ctx.setdefault("figures", {})["agent_timeline"] = plotly_json(fig)
