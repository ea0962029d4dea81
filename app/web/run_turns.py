"""Run-page context for multi-turn runs: the turn table and its figures (``turn_ttft``,
``turn_ttft_per_token``), from the stored table or the request rows (``run_turns``), never
from events, and the prefix-cache share the responses reported. A single-turn run gets
``turns`` empty and no figure. Beside them, the stored per-process figures of a dealt run
(``run_processes``) and the per-model / per-target tables of a run of several
(``run_groups``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.analysis.groups import DIMENSIONS
from app.analysis.groups import STATS_KEY as GROUPS_KEY
from app.analysis.metric_defs import TTFT
from app.analysis.prefix_cache import responses_prefix_cache
from app.analysis.turns import PER_TOKEN, turn_metrics
from app.figures.scriptjson import plotly_json
from app.figures.turns import turn_figures
from app.services import run_turns
from app.storage.db import session_scope


def turn_columns() -> list[tuple[str, str, str, int]]:
    """The turn table's metric columns: (row key, statistic, heading, decimals): each turn
    metric's p50 and p99 (TTFT's followed by TTFT per prompt token's p50 and mean)."""
    out: list[tuple[str, str, str, int]] = []
    for m in turn_metrics():
        out += [(m.key, st, f"{m.label} {st}", m.decimals) for st in ("p50", "p99")]
        if m is TTFT:
            out += [(PER_TOKEN, st, f"TTFT per prompt token {st}", 4) for st in ("p50", "mean")]
    return out


def add_turns(ctx: dict[str, Any], sessions: sessionmaker[Session], run_id: str) -> None:
    """Add ``turns`` (the turn table's rows, [] for a single-turn run), its figures and
    ``prefix_cache_responses`` (the cached share the responses reported, or None); the
    report in ``ctx`` gets ``turns`` when it was computed now."""
    run = ctx.get("run") or {}
    report = ctx.get("report")
    ctx["turns"] = []
    ctx.setdefault("prefix_cache_responses", None)
    if not run_turns.is_multi_turn(run):
        return
    with session_scope(sessions) as s:
        table = run_turns.turn_table_of_run(s, run_id, run)
    if not table:
        return
    if isinstance(report, dict):
        report.setdefault("turns", table)
    ctx["turns"] = table
    ctx["turn_columns"] = turn_columns()
    ctx["prefix_cache_responses"] = responses_prefix_cache(table)
    figures = ctx.setdefault("figures", {})
    for key, fig in turn_figures(table).items():
        figures[key] = plotly_json(fig)


def run_processes(run: dict[str, Any]) -> list[dict[str, Any]]:
    """A run dealt over load processes (``app.client.shards``): its per-process figures as
    stored in its load statistics; [] for a run of one process."""
    stats = run.get("load_stats")
    rows = stats.get("processes") if isinstance(stats, dict) else None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def run_shards(run: dict[str, Any]) -> list[dict[str, Any]]:
    """A run dealt over workers (``app.services.shard_jobs``): its per-shard figures as
    stored in its load statistics; [] for a run of one shard."""
    stats = run.get("load_stats")
    rows = stats.get("shards") if isinstance(stats, dict) else None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def run_groups(run: dict[str, Any]) -> dict[str, Any]:
    """A run of several models or targets (``app.analysis.groups``): its tables by model and
    by target as stored in its load statistics, and each target's ``/metrics`` scrape
    (``app.client.target_scrapes``); {} for a run of one model and one target."""
    stats = run.get("load_stats")
    if not isinstance(stats, dict):
        return {}
    groups = stats.get(GROUPS_KEY)
    tables = {
        d: [r for r in groups.get(d) or [] if isinstance(r, dict)]
        for d in DIMENSIONS
        if isinstance(groups, dict) and groups.get(d)
    }
    scrape = stats.get("server_metrics")
    scrapes = scrape.get("targets") if isinstance(scrape, dict) else None
    if not tables:
        return {}
    return {"tables": tables, "scrapes": scrapes if isinstance(scrapes, list) else []}
