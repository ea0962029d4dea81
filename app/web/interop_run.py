"""Run-page context for imports and server metrics (reads storage; see ``interop_view``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.analysis.prefix_cache import cached_share, prefix_cache
from app.analysis.server_controls import control_rows
from app.figures.interop import server_metrics_figure_of
from app.figures.scriptjson import plotly_json
from app.services.import_compare import comparison_of, import_window
from app.services.run_summaries import RunSummary
from app.storage import interop as interop_repo
from app.storage import repository as repo
from app.storage import turn_rows
from app.storage.db import session_scope
from app.web.interop_view import import_setup


def add_interop(
    ctx: dict[str, Any], sessions: sessionmaker[Session], run_id: str, summary: RunSummary
) -> None:
    """Add ``imported`` (the file's figures beside ours, or None), ``import_setup`` (what
    an imported file says about its setup, or None for our own runs), ``server_status``,
    ``prefix_cache`` (the server's counters, ``app.analysis.prefix_cache``),
    ``prefix_cache_responses`` (the cached share its responses reported),
    ``server_controls`` (the engine's identity, cache reset, profiler and speculative
    decoding: ``app.analysis.server_controls``) and the
    ``server_metrics`` figure to a run page's context."""
    with session_scope(sessions) as s:
        info = interop_repo.get_import(s, run_id)
        group = interop_repo.group_runs(s, info.group_id) if info is not None else []
        series = interop_repo.load_server_metrics(s, run_id)
        row = repo.find_run(s, run_id)
        model = row.model if row is not None else None
        target = row.target_url if row is not None else None
        cached = turn_rows.cached_prompt_sums(s, run_id)
    source = str((ctx.get("run") or {}).get("source") or "")
    ctx["import_setup"] = (
        import_setup(source, info, model=model, target=target)
        if source.startswith("import")
        else None
    )
    load = (ctx.get("report") or {}).get("load") or {}
    status_block = load.get("server_metrics") if isinstance(load, dict) else None
    status = status_block.get("status") if isinstance(status_block, dict) else None
    cols = summary.columns
    ctx["imported"] = None
    if info is not None:
        part = summary.imported
        if part is None or not part.matches(info):  # the summary is live and older than this
            raise LookupError(f"run {run_id!r}: the page summary has no import part")
        window = import_window(cols.sent_ns, info.window_s)
        ctx["imported"] = comparison_of(info, part.metrics, window, group)
    ctx["server_status"] = status_block if isinstance(status_block, dict) else None
    ctx["server_controls"] = control_rows(load) if isinstance(load, dict) else []
    fig = server_metrics_figure_of(series, cols, status)
    figures = ctx.setdefault("figures", {})
    figures["server_metrics"] = plotly_json(fig)
    ctx["has_server_metrics"] = bool(series)
    ctx["prefix_cache"] = prefix_cache(series)
    ctx["prefix_cache_responses"] = cached_share(*cached)
