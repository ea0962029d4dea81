"""Figures of a series (pure): the trend of one metric over its runs, each run's value with
its 95% interval as an error bar, the counted runs apart from the flagged and the untrusted
ones, each segment's median as a step, and the change points marked. Every point carries
its run id (``customdata``): the page opens the run on a click. Also the live panels' time
series (``app.web.runs_live``)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from app.figures.common import _layout, empty_figure

Figure = dict[str, Any]

COLORS = {"counted": "#1565c0", "flagged": "#ef6c00", "untrusted": "#c62828"}


def _group(p: Mapping[str, Any]) -> str:
    if p["state"] == "flagged":
        return "flagged"
    return "counted" if p["trusted"] else "untrusted"


def trend_figure(trend: Mapping[str, Any], *, title: str) -> Figure:
    """The trend (``app.analysis.series.Trend.to_dict()``) as a Plotly figure: x is the
    run's position in the series (its name in the hover), y its value."""
    points = [p for p in trend["points"] if p["value"] is not None]
    unit = trend.get("unit") or ""
    ytitle = f"{trend['label']} ({unit})" if unit else str(trend["label"])
    if not points:
        return empty_figure(title, "no run of the series has this metric")
    index = {p["run_id"]: i for i, p in enumerate(trend["points"])}
    data: list[dict[str, Any]] = []
    names = {"counted": "runs", "flagged": "flagged (key differs)", "untrusted": "untrusted"}
    for group, color in COLORS.items():
        ps = [p for p in points if _group(p) == group]
        if not ps:
            continue
        ys = [p["value"] for p in ps]
        plus = [None if p["ci_high"] is None else p["ci_high"] - p["value"] for p in ps]
        minus = [None if p["ci_low"] is None else p["value"] - p["ci_low"] for p in ps]
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": names[group],
                "x": [index[p["run_id"]] for p in ps],
                "y": ys,
                "customdata": [p["run_id"] for p in ps],
                "text": [f"{p['label']}<br>{p['created_at'][:19]}" for p in ps],
                "hovertemplate": "%{text}<br>%{y}<extra></extra>",
                "marker": {
                    "color": color,
                    "size": 7,
                    "symbol": "circle" if group == "counted" else "x",
                },
                "error_y": {
                    "type": "data",
                    "symmetric": False,
                    "array": plus,
                    "arrayminus": minus,
                    "thickness": 1,
                    "width": 2,
                    "color": color,
                },
            }
        )
    data += _segments(trend)
    layout = _layout(title, "run in the series (oldest first)", ytitle, height=380)
    layout["showlegend"] = True
    layout["legend"] = {"orientation": "h", "y": -0.2}
    layout["shapes"] = [
        {
            "type": "line",
            "xref": "x",
            "yref": "paper",
            "x0": c["index"] - 0.5,
            "x1": c["index"] - 0.5,
            "y0": 0,
            "y1": 1,
            "line": {
                "color": "#c62828" if c["kind"] == "regression" else "#2e7d32",
                "dash": "dash",
                "width": 2,
            },
        }
        for c in trend["change_points"]
    ]
    layout["annotations"] = [
        {
            "x": c["index"] - 0.5,
            "y": 1.0,
            "xref": "x",
            "yref": "paper",
            "yanchor": "bottom",
            "showarrow": False,
            "text": _change_text(c),
            "font": {"size": 11},
        }
        for c in trend["change_points"]
    ]
    return {"data": data, "layout": layout}


def _change_text(c: Mapping[str, Any]) -> str:
    rel = c.get("relative")
    return str(c["kind"]) + ("" if rel is None else f" {rel * 100:+.1f}%")


def _segments(trend: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each segment's median (between change points) as a horizontal step."""
    pts = trend["points"]
    cuts = [0, *[c["index"] for c in trend["change_points"]], len(pts)]
    xs: list[float | None] = []
    ys: list[float | None] = []
    for i, (a, b) in enumerate(itertools.pairwise(cuts)):
        level = _level(trend, i)
        if level is None:
            continue
        xs += [a - 0.5, b - 0.5, None]
        ys += [level, level, None]
    if not xs:
        return []
    return [
        {
            "type": "scatter",
            "mode": "lines",
            "name": "segment median",
            "x": xs,
            "y": ys,
            "hoverinfo": "skip",
            "line": {"color": "#637079", "width": 1.5},
        }
    ]


def _level(trend: Mapping[str, Any], segment: int) -> float | None:
    """The median of segment ``segment``: a change point's ``before`` (its ``after`` for
    the last segment); without change points, the median of the counted values."""
    cps = trend["change_points"]
    if cps:
        return float(cps[segment]["before"] if segment < len(cps) else cps[-1]["after"])
    vals = sorted(p["value"] for p in trend["points"] if p["counted"])
    if not vals:
        return None
    mid = len(vals) // 2
    return float(vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2)


def live_figure(
    title: str, ytitle: str, t_s: Sequence[float], series: Mapping[str, Sequence[float | None]]
) -> Figure:
    """Lines over the run's time (s): one per named series (the live panels)."""
    if not t_s or not series:
        return empty_figure(title, "nothing measured yet")
    data = [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": name,
            "x": list(t_s),
            "y": list(ys),
            "marker": {"size": 4},
        }
        for name, ys in series.items()
    ]
    layout = _layout(title, "time in the run (s)", ytitle, height=280)
    layout["showlegend"] = True
    layout["legend"] = {"orientation": "h", "y": -0.3}
    return {"data": data, "layout": layout}
