"""The CLI's table of a run of several models or targets: its figures per model and per
target (``report["groups"]``, ``app.analysis.groups``)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from app.analysis.groups import DIMENSIONS

HEADINGS = (
    ("requests", "requests", 0),
    ("ok", "ok", 0),
    ("failed", "failed", 0),
    ("ttft_p50_ms", "TTFT p50 (ms)", 2),
    ("ttft_p99_ms", "TTFT p99 (ms)", 2),
    ("tpot_p50_ms", "TPOT p50 (ms)", 2),
    ("output_tok_s", "output tok/s", 1),
)


def _cell(v: Any, digits: int) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def render_groups(groups: Any, console: Console) -> None:
    """One table per dimension the run has (model, target)."""
    if not isinstance(groups, dict):
        return
    for dim in DIMENSIONS:
        rows = [r for r in groups.get(dim) or [] if isinstance(r, dict)]
        if not rows:
            continue
        t = Table(title=f"By {dim}")
        t.add_column(dim)
        for _, heading, _ in HEADINGS:
            t.add_column(heading, justify="right")
        for row in rows:
            t.add_row(str(row.get(dim)), *(_cell(row.get(k), d) for k, _, d in HEADINGS))
        console.print(t)
