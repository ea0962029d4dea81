"""A multi-turn run's metrics by turn index, for its page, report and exports.

The table is computed where the load ran and stored with the run (``load_stats.turns``,
``app.client.execute``); a multi-turn run stored without it (by an older client or worker)
has it computed from its stored request rows (``app.storage.turn_rows``: seven summary
columns, no event read). A single-turn run has none."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session

from app.analysis.turns import turn_table_of
from app.storage import turn_rows


def is_multi_turn(run: Mapping[str, Any]) -> bool:
    """Whether the run replayed sessions (its spec says so, or it stored a turn table), or
    may have: an imported run, whose requests carry a turn where the file was multi-turn
    (``turn_table_of_run`` then finds none in a single-turn file's rows)."""
    load = run.get("load_stats") or {}
    spec = run.get("spec") or {}
    imported = str(run.get("source") or "").startswith("import:")
    return isinstance(load.get("turns"), list) or bool(spec.get("multi_turn")) or imported


def turn_table_of_run(
    s: Session, run_id: str, run: Mapping[str, Any]
) -> list[dict[str, Any]] | None:
    """The run's turn table (``app.analysis.turns``): the stored one, else computed from
    its request rows; None for a single-turn run (or one with no measured turn)."""
    stored = (run.get("load_stats") or {}).get("turns")
    if isinstance(stored, list):
        return [dict(r) for r in stored if isinstance(r, Mapping)]
    if not is_multi_turn(run):
        return None
    cols = turn_rows.turn_columns(s, run_id)
    if not cols.n_requests:
        return None
    table = turn_table_of(
        cols.turn,
        cols.ok,
        cols.values,
        cols.input_tokens,
        cached_prompt_tokens=cols.cached_prompt_tokens,
        usage_prompt_tokens=cols.usage_prompt_tokens,
    )
    return [dict(r) for r in table]
