"""A multi-turn run's figures by turn index (from its turn table, ``app.analysis.turns``):
TTFT and TTFT per prompt token per turn. With a prefix cache the second falls after turn 1
(the history is already cached). Drawn from the table's few numbers, never from events."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from app.analysis.metric_defs import TTFT
from app.analysis.turns import PER_TOKEN
from app.figures.common import Figure, _layout, empty_figure, values

TTFT_TITLE = "TTFT by turn"
PER_TOKEN_TITLE = "TTFT per prompt token by turn"
SERIES = (("p50", "p50", "#1565c0", "solid"), ("p99", "p99", "#c62828", "dot"))


def _stat(row: Mapping[str, Any], quantity: str, stat: str) -> float:
    d = row.get(quantity)
    v = d.get(stat) if isinstance(d, Mapping) else None
    return float(v) if isinstance(v, int | float) else float("nan")


def _by_turn(
    table: Sequence[Mapping[str, Any]], quantity: str, title: str, ytitle: str, digits: int
) -> Figure:
    if not any(int(r.get("ok") or 0) for r in table):
        return empty_figure(title, "no successful turn")
    turns = [int(r["turn"]) for r in table]
    counts = [int(r.get("ok") or 0) for r in table]
    data: list[dict[str, Any]] = []
    for stat, label, color, dash in SERIES:
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": label,
                "x": turns,
                "y": values([_stat(r, quantity, stat) for r in table], digits),
                "customdata": counts,
                "line": {"color": color, "dash": dash},
                "hovertemplate": (
                    f"turn %{{x}}<br>{label} %{{y}} ms<br>%{{customdata}} successful requests"
                    "<extra></extra>"
                ),
            }
        )
    layout = _layout(title, "turn index", ytitle, showlegend=True)
    layout["xaxis"] |= {"tickmode": "array", "tickvals": turns, "tickformat": ",d"}
    layout["yaxis"]["rangemode"] = "tozero"
    layout["legend"] = {"orientation": "h", "y": -0.25}
    return {"data": data, "layout": layout}


def turn_figures(table: Sequence[Mapping[str, Any]]) -> dict[str, Figure]:
    """``turn_ttft`` and ``turn_ttft_per_token`` (p50 and p99 per turn index)."""
    return {
        "turn_ttft": _by_turn(table, TTFT.key, TTFT_TITLE, TTFT.heading, 3),
        "turn_ttft_per_token": _by_turn(
            table, PER_TOKEN, PER_TOKEN_TITLE, "TTFT / prompt tokens (ms)", 5
        ),
    }
