"""Items answered per second, for a surface that generates no tokens: the items its answers
carried (inputs embedded, documents scored: ``app.analysis.answers``) / the observation
window; a view names them by the run's endpoint (its ``items``). None for other runs."""

from __future__ import annotations

from app.analysis.run_counts import rate

from .base import Metric, RunTotals


def _items_per_s(t: RunTotals) -> float | None:
    return None if t.items is None else rate(t.items, t.window)


ITEMS_PER_S = Metric(
    key="items_per_s",
    label="Items/s",
    title="Items answered per second",
    unit="items/s",
    decimals=1,
    aggregation="per_run",
    better="higher",
    per_run=_items_per_s,
    answers=True,
    views=frozenset(("compare",)),
)
