"""Plotly figure builders for comparisons and sweeps (pure: data in, figure dict out)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from app.analysis.metric_defs import OUTPUT_THROUGHPUT
from app.analysis.metric_defs import metric as metric_def
from app.figures.common import MAX_POINTS, Figure, _layout, downsample_note, empty_figure, evenly
from app.figures.common import values as jvalues

PALETTE = ("#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f")
VERDICT_COLORS = {
    "regressed": "#c62828",
    "improved": "#2e7d32",
    "no significant change": "#9e9e9e",
    "no data": "#e0e0e0",
}
SLO_FILL = "rgba(46,125,50,0.10)"


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


BASELINE_TAG = " (baseline)"


def sweep_name(sweep: Mapping[str, Any], baseline: str | None) -> str:
    """A sweep's name in a legend: its label, and "(baseline)" on the sweep the others are
    compared to (``baseline``: its id)."""
    name = str(sweep.get("label") or sweep["id"])
    return name + BASELINE_TAG if baseline is not None and sweep["id"] == baseline else name


def _width(sweep: Mapping[str, Any], baseline: str | None) -> float:
    return 3.0 if baseline is not None and sweep["id"] == baseline else 2.0


def overlaid_cdf_figure(
    series: Sequence[tuple[str, npt.ArrayLike]],
    *,
    title: str,
    unit: str = "ms",
    xtitle: str | None = None,
    max_points: int = MAX_POINTS,
) -> Figure:
    """One empirical CDF per (label, samples); NaN samples dropped."""
    traces: list[dict[str, Any]] = []
    layout = _layout(
        title, xtitle or f"value ({unit})", "fraction of samples (0–1)", showlegend=True
    )
    layout["yaxis"]["range"] = [0, 1.02]
    layout["legend"] = {"orientation": "h", "y": -0.25}
    layout["height"] = 340
    down = False
    for i, (label, samples) in enumerate(series):
        a = np.asarray(samples, np.float64)
        x = np.sort(a[np.isfinite(a)])
        n = int(x.shape[0])
        if n == 0:
            continue
        keep = evenly(n, max_points)
        down |= keep.shape[0] < n
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": label,
                "x": jvalues(x[keep]),
                "y": jvalues((keep + 1) / n, 5),
                "line": {"shape": "hv", "color": color(i)},
                "hovertemplate": f"{label}: %{{x}} {unit}<br>%{{y:.2%}}<extra></extra>",
            }
        )
    if not traces:
        return empty_figure(title, "no samples in any run")
    if down:
        note = downsample_note(max_points, max_points)
        layout["annotations"].append(note | {"text": f"downsampled: {max_points:,} points a run"})
    return {"data": traces, "layout": layout}


def delta_figure(pair: Mapping[str, Any], *, title: str) -> Figure:
    """Relative change per metric percentile with its interval, coloured by verdict."""
    labels: list[str] = []
    rel: list[float | None] = []
    lo: list[float] = []
    hi: list[float] = []
    colors: list[str] = []
    for key, mc in pair["metrics"].items():
        for p in mc["percentiles"]:
            base, r = p["baseline"], p["rel_delta"]
            labels.append(f"{metric_def(key).label} {p['key']}")
            rel.append(None if r is None else round(100 * r, 3))
            ok = r is not None and base and p["ci_low"] is not None
            lo.append(round(100 * (r - p["ci_low"] / abs(base)), 3) if ok else 0.0)
            hi.append(round(100 * (p["ci_high"] / abs(base) - r), 3) if ok else 0.0)
            colors.append(VERDICT_COLORS.get(p["verdict"], "#9e9e9e"))
    if not labels:
        return empty_figure(title, "no metrics")
    trace = {
        "type": "bar",
        "x": labels,
        "y": rel,
        "marker": {"color": colors},
        "error_y": {"type": "data", "symmetric": False, "array": hi, "arrayminus": lo},
        "hovertemplate": "%{x}: %{y:+.1f}%<extra></extra>",
    }
    layout = _layout(title, "metric and percentile", "change vs baseline (%)")
    return {"data": [trace], "layout": layout}


def _slo_shape(limit: float) -> dict[str, Any]:
    return {
        "type": "rect",
        "xref": "paper",
        "yref": "y",
        "x0": 0,
        "x1": 1,
        "y0": 0,
        "y1": limit,
        "fillcolor": SLO_FILL,
        "line": {"width": 0},
        "layer": "below",
    }


def sweep_latency_figure(
    sweeps: Sequence[Mapping[str, Any]],
    metric: str,
    *,
    title: str,
    slo_ms: float | None = None,
    baseline: str | None = None,
) -> Figure:
    """Latency p50 (solid) and p99 (dashed) against achieved output throughput, one pair
    of lines per sweep; the SLO region shaded; each sweep's max-goodput step starred;
    ``baseline``: the id of the sweep the others are compared to (named so, drawn wider)."""
    traces: list[dict[str, Any]] = []
    for i, sw in enumerate(sweeps):
        name = sweep_name(sw, baseline)
        steps = [s for s in sw["steps"] if s["role"] == "step"]
        x = [s[OUTPUT_THROUGHPUT.key] for s in steps]
        for p, dash in (("p50", "solid"), ("p99", "dash")):
            y = [(s["latency_ms"].get(metric) or {}).get(p) for s in steps]
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "name": f"{name} {p}",
                    "x": jvalues(np.array(x, np.float64)),
                    "y": jvalues(np.array(y, np.float64)),
                    "line": {"color": color(i), "dash": dash, "width": _width(sw, baseline)},
                    "customdata": [s["load"] for s in steps],
                    "hovertemplate": "load %{customdata}<br>%{x:.0f} tok/s<br>%{y:.1f} ms"
                    "<extra></extra>",
                }
            )
        best = (sw.get("max_goodput") or {}).get("step")
        if best is not None and 0 <= best < len(steps):
            s = steps[best]
            traces.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": f"{name} max goodput",
                    "x": jvalues(np.array([s[OUTPUT_THROUGHPUT.key]], np.float64)),
                    "y": jvalues(
                        np.array([(s["latency_ms"].get(metric) or {}).get("p99")], np.float64)
                    ),
                    "marker": {"symbol": "star", "size": 16, "color": color(i)},
                    "hovertemplate": "max goodput<extra></extra>",
                }
            )
    if not traces:
        return empty_figure(title, "no steps")
    layout = _layout(
        title, "achieved output throughput (tok/s)", metric_def(metric).heading, showlegend=True
    )
    layout["legend"] = {"orientation": "h", "y": -0.3}
    layout["height"] = 360
    if slo_ms is not None:
        layout["shapes"] = [_slo_shape(slo_ms)]
        layout["annotations"].append(
            {"text": f"SLO p99 ≤ {slo_ms:g} ms", "xref": "paper", "yref": "y", "x": 0,
             "y": slo_ms, "xanchor": "left", "yanchor": "bottom", "showarrow": False,
             "font": {"size": 11, "color": "#2e7d32"}}
        )  # fmt: skip
    return {"data": traces, "layout": layout}


def sweep_latency_load_figure(
    sweeps: Sequence[Mapping[str, Any]],
    metric: str,
    *,
    title: str,
    slo_ms: float | None = None,
    baseline: str | None = None,
) -> Figure:
    """Latency p50 (solid) and p99 (dashed) against the offered load (rate or concurrency),
    one pair of lines per sweep (auto sweeps' probe runs left out, as in the other charts);
    ``baseline`` as in ``sweep_latency_figure``."""
    traces: list[dict[str, Any]] = []
    for i, sw in enumerate(sweeps):
        name = sweep_name(sw, baseline)
        steps = [s for s in sw["steps"] if s["role"] == "step" and s["load"] is not None]
        x = [s["load"] for s in steps]
        for p, dash in (("p50", "solid"), ("p99", "dash")):
            y = [(s["latency_ms"].get(metric) or {}).get(p) for s in steps]
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "name": f"{name} {p}",
                    "x": jvalues(np.array(x, np.float64)),
                    "y": jvalues(np.array(y, np.float64)),
                    "line": {"color": color(i), "dash": dash, "width": _width(sw, baseline)},
                    "hovertemplate": "offered %{x}<br>%{y:.1f} ms<extra></extra>",
                }
            )
    if not any(t["x"] for t in traces):
        return empty_figure(title, "no steps")
    xt = "offered load (req/s or concurrency)"
    layout = _layout(title, xt, metric_def(metric).heading, showlegend=True)
    layout["legend"] = {"orientation": "h", "y": -0.3}
    layout["height"] = 360
    if slo_ms is not None:
        layout["shapes"] = [_slo_shape(slo_ms)]
    return {"data": traces, "layout": layout}


def sweep_throughput_figure(
    sweeps: Sequence[Mapping[str, Any]], *, title: str, baseline: str | None = None
) -> Figure:
    """Achieved request rate against offered load (and the y = x line for rate sweeps);
    ``baseline`` as in ``sweep_latency_figure``."""
    traces: list[dict[str, Any]] = []
    top = 0.0
    rate = False
    for i, sw in enumerate(sweeps):
        steps = [s for s in sw["steps"] if s["role"] == "step"]
        loads = [s["load"] for s in steps]
        rate |= any(s["load_kind"] == "rate" for s in steps)
        top = max([top, *[v for v in loads if v is not None]])
        traces.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": sweep_name(sw, baseline),
                "x": jvalues(np.array(loads, np.float64)),
                "y": jvalues(np.array([s["achieved_rps"] for s in steps], np.float64)),
                "line": {"color": color(i), "width": _width(sw, baseline)},
                "hovertemplate": "offered %{x}<br>achieved %{y:.2f} req/s<extra></extra>",
            }
        )
    if not traces:
        return empty_figure(title, "no steps")
    if rate and top > 0:
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": "achieved = offered",
                "x": [0, top],
                "y": [0, top],
                "line": {"color": "#9e9e9e", "dash": "dot"},
                "hoverinfo": "skip",
            }
        )
    xt = "offered load (req/s or concurrency)"
    layout = _layout(title, xt, "achieved rate (req/s)", showlegend=True)
    layout["legend"] = {"orientation": "h", "y": -0.3}
    layout["height"] = 360
    return {"data": traces, "layout": layout}
