"""The target's server metrics on the run's time axis, beside the client's view. Pure: data in,
Plotly figure dicts out."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from app.analysis.metric_defs import E2EL, TTFT
from app.analysis.request_columns import RequestColumns, request_columns
from app.domain import RunTrace
from app.figures import common as fg
from app.protocol.prometheus import Series, counter_rate

NS_PER_S = 1e9


ROW_DOMAINS = ((0.78, 1.0), (0.53, 0.74), (0.27, 0.49), (0.0, 0.23))
COLORS = ("#1565c0", "#ef6c00", "#2e7d32", "#8e24aa", "#c62828", "#00897b", "#6d6d6d")


def _label(s: Series) -> str:
    extra = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
    return f"{s.name}{{{extra}}}" if extra else s.name


def _line(name: str, x: Any, y: Any, axis: str, color: str, shape: str = "hv") -> dict[str, Any]:
    """An SVG line, at most ``MAX_POINTS`` points (each bucket's min and max kept)."""
    xa, ya = np.asarray(x, np.float64), np.asarray(y, np.float64)
    keep = fg.minmax_keep(ya, fg.MAX_POINTS)
    return {
        "type": "scatter",
        "mode": "lines",
        "name": name,
        "x": fg.values(xa[keep], 3),
        "y": fg.values(ya[keep], 3),
        "yaxis": axis,
        "line": {"shape": shape, "color": color},
        "hovertemplate": f"{name}<br>%{{x:.2f}} s: %{{y}}<extra></extra>",
    }


def server_metrics_figure(series: list[Series], trace: RunTrace, status: str | None) -> fg.Figure:
    """Server series beside the client's view, one shared time axis (s since run start):
    requests (client in flight, server running / waiting), server token rates, KV-cache
    usage and preemptions (and other configured series), and per-request latencies."""
    return server_metrics_figure_of(series, request_columns(trace), status)


def server_metrics_figure_of(
    series: list[Series], trace: RequestColumns, status: str | None
) -> fg.Figure:
    """``server_metrics_figure`` from the run's per-request values (no event needed)."""
    title = "Server metrics and client view"
    if not series:
        reason = "the target exposed no scraped series"
        if status:
            reason = f"server metrics: {status}"
        return fg.empty_figure(title, reason)
    data: list[dict[str, Any]] = []
    color = itertools.cycle(COLORS)  # as many series as a run keeps (up to 128)
    sent = np.where(trace.sent_ns >= 0, trace.sent_ns / NS_PER_S, np.nan)
    end = np.where(trace.end_ns >= 0, trace.end_ns / NS_PER_S, np.nan)
    horizon = max(
        [float(np.nanmax(end)) if np.isfinite(end).any() else 0.0]
        + [t / NS_PER_S for s in series for t in s.t_ns[-1:]]
    )
    if np.isfinite(sent).any():
        x, y, _total = fg.in_flight_steps(sent, end, horizon)
        data.append(_line("client: in flight", x, y, "y", next(color)))
    for s in series:
        t = np.asarray(s.t_ns, np.float64) / NS_PER_S
        v = np.asarray(s.values, np.float64)
        role = s.role
        if role in ("running", "waiting"):
            data.append(_line(f"server {role}: {_label(s)}", t, v, "y", next(color)))
        elif role in ("prompt_tokens", "generation_tokens"):
            xs, ys = counter_rate(s.t_ns, s.values)
            data.append(_line(f"{role} /s: {_label(s)}", xs, ys, "y2", next(color), "linear"))
        elif role == "kv_cache_usage":
            scale = 100.0 if v.size and float(np.nanmax(v)) <= 1.0 else 1.0
            data.append(_line(f"KV cache %: {_label(s)}", t, v * scale, "y3", next(color)))
        else:
            data.append(_line(_label(s), t, v, "y3", next(color), "linear"))
    ttft = trace.values[TTFT.key]
    ok = np.isfinite(ttft) & np.isfinite(sent)
    if ok.any():
        order = np.argsort(sent[ok], kind="stable")
        for m in (TTFT, E2EL):
            name, arr = f"{m.name} {m.unit}", trace.values[m.key]
            when, lat_ms = sent[ok][order], arr[ok][order] / m.per_unit
            keep = fg.minmax_keep(lat_ms, fg.MAX_POINTS)  # SVG: many browsers lack WebGL
            data.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": f"client {name}",
                    "x": fg.values(when[keep], 3),
                    "y": fg.values(lat_ms[keep], 2),
                    "yaxis": "y4",
                    "marker": {"size": 4, "color": next(color)},
                    "hovertemplate": f"sent %{{x:.2f}} s: {name} %{{y}}<extra></extra>",
                }
            )
    empty = [str(tr["name"]) for tr in data if not tr["x"]]
    data = [tr for tr in data if tr["x"]]  # a rate needs two scrapes: say so, draw no ghost
    if not data:
        return fg.empty_figure(title, "every scraped series has fewer than 2 samples")
    for tr in data:
        if tr["mode"] == "lines" and len(tr["x"]) < 3:
            tr["mode"] = "lines+markers"  # one or two scrapes: a line alone is invisible
    layout = fg._layout(title, "time since run start (s)", "requests (count)")
    if empty:
        layout["annotations"].append(
            fg._note(
                f"not drawn (fewer than 2 scrapes): {', '.join(empty)}", y=1.0, yanchor="bottom"
            )
        )
    layout["height"] = 640
    layout["showlegend"] = True
    layout["legend"] = {"orientation": "h", "y": -0.12}
    layout["xaxis"]["anchor"] = "y4"
    titles = (
        "requests (count)",
        "server throughput (tok/s)",
        "KV cache (%) / other",
        "client latency (ms)",
    )
    for i, (dom, ytitle) in enumerate(zip(ROW_DOMAINS, titles, strict=True)):
        key = "yaxis" if i == 0 else f"yaxis{i + 1}"
        axis = layout.get(key, {})
        axis.update(
            {"domain": list(dom), "title": {"text": ytitle}, "rangemode": "tozero", "anchor": "x"}
        )
        layout[key] = axis
    return {"data": data, "layout": layout}
