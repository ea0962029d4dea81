"""Run-page context for multi-turn runs: the turn table and its figures (``turn_ttft``,
``turn_ttft_per_token``), from the stored table or the request rows (``run_turns``), never
from events. A single-turn run gets ``turns`` empty and no figure."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.figures.scriptjson import plotly_json
from app.figures.turns import turn_figures
from app.services import run_turns
from app.storage.db import session_scope


def add_turns(ctx: dict[str, Any], sessions: sessionmaker[Session], run_id: str) -> None:
    """Add ``turns`` (the turn table's rows, [] for a single-turn run) and its figures; the
    report in ``ctx`` gets ``turns`` when it was computed now."""
    run = ctx.get("run") or {}
    report = ctx.get("report")
    ctx["turns"] = []
    if not run_turns.is_multi_turn(run):
        return
    with session_scope(sessions) as s:
        table = run_turns.turn_table_of_run(s, run_id, run)
    if not table:
        return
    if isinstance(report, dict):
        report.setdefault("turns", table)
    ctx["turns"] = table
    figures = ctx.setdefault("figures", {})
    for key, fig in turn_figures(table).items():
        figures[key] = plotly_json(fig)
