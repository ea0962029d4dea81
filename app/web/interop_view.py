"""Run-page parts of interoperability: an imported file's own figures beside ours (under the
file's definitions), and the target's server metrics on the run's time axis. Pure: data in,
rows and Plotly figure dicts out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from app.analysis.metrics import per_request_metrics
from app.analysis.profiles import profile_metrics
from app.domain import RunTrace
from app.protocol.prometheus import Series, counter_rate
from app.storage.interop import ImportInfo
from app.web import figures as fg

STAT_ORDER = ("mean", "std", "p50", "p90", "p95", "p99", "p99_9", "max", "value")
STAT_LABELS = {"p99_9": "p99.9", "value": "value"}
NS_PER_S = 1e9


@dataclass(frozen=True, slots=True)
class FigureRow:
    metric: str
    label: str
    unit: str
    stat: str
    file_value: float | None
    ours: float | None
    diff_pct: float | None  # (ours - file) / file, percent


@dataclass(frozen=True, slots=True)
class ImportComparison:
    tool: str
    profile: str | None
    file_name: str | None
    rows: list[FigureRow]
    window_note: str | None
    group_runs: list[str]


def _window(trace: RunTrace, window_s: float | None) -> tuple[int, int] | None:
    sent = trace.sent_ns[trace.sent_ns >= 0]
    if window_s is None or sent.size == 0:
        return None
    start = int(sent.min())
    return start, start + round(window_s * NS_PER_S)


def import_comparison(info: ImportInfo, trace: RunTrace, group_runs: list[str]) -> ImportComparison:
    """The file's figures, ours computed under its tool's definitions, and the difference."""
    window = _window(trace, info.window_s)
    ours_metrics: dict[str, Any] = {}
    if info.profile is not None and trace.n_requests:
        ours_metrics = profile_metrics(trace, info.profile, window_ns=window).to_dict()["metrics"]  # type: ignore[assignment]
    rows: list[FigureRow] = []
    for metric, stats in info.figures.items():
        ours = ours_metrics.get(metric) or {}
        label = str(ours.get("label") or metric)
        unit = str(ours.get("unit") or ("ms" if "value" not in stats else ""))
        for stat in STAT_ORDER:
            if stat not in stats or stats[stat] is None:
                continue
            file_value = float(stats[stat])  # type: ignore[arg-type]
            mine = ours.get(stat)
            ours_v = float(mine) if isinstance(mine, int | float) else None
            diff = None
            if ours_v is not None and file_value != 0:
                diff = (ours_v - file_value) / abs(file_value) * 100.0
            rows.append(
                FigureRow(
                    metric, label, unit, STAT_LABELS.get(stat, stat), file_value, ours_v, diff
                )
            )
    note = None
    if window is not None and info.window_s is not None:
        note = (
            f"throughputs divide by the file's own duration ({info.window_s:.3f} s) "
            "from the first request's start"
        )
    return ImportComparison(info.tool, info.profile, info.file_name, rows, note, group_runs)


SETUP_LABELS = {
    "strategy": "load strategy",
    "load": "load",
    "load_kind": "load kind",
    "duration_s": "duration (s)",
    "requests": "requests",
    "start_time": "started",
    "end_time": "ended",
    "benchmark_index": "benchmark in the file",
    "benchmark_id": "benchmark id",
}


@dataclass(frozen=True, slots=True)
class ImportSetup:
    """What an imported file says about the run it measured (imports have no spec of
    ours, no schedule and no client of ours)."""

    source: str  # "CSV log", "GuideLLM 0.8.1 file guidellm-benchmarks.json"
    model: str | None
    target: str | None
    rows: list[tuple[str, str]]  # (setting, value) as the file states them


def _setting(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def import_setup(
    source: str, info: ImportInfo | None, *, model: str | None, target: str | None
) -> ImportSetup:
    """The header and settings table of an imported run: the tool and file it came from
    and every setting the file states (its ``meta``), in a stable order."""
    if info is None:
        fmt = source.removeprefix("import:") or "file"
        return ImportSetup(f"{fmt.upper() if fmt == 'csv' else fmt} log", model, target, [])
    where = f"{info.tool} file {info.file_name}" if info.file_name else info.tool
    meta = info.meta or {}
    keys = [k for k in SETUP_LABELS if k in meta] + sorted(k for k in meta if k not in SETUP_LABELS)
    rows = [
        (SETUP_LABELS.get(k, k.replace("_", " ")), _setting(meta[k]))
        for k in keys
        if meta[k] is not None and not isinstance(meta[k], dict | list)
    ]
    return ImportSetup(where, model, target, rows)


# --------------------------------------------------------------------------- server metrics

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
    title = "Server metrics and client view"
    if not series:
        reason = "the target exposed no scraped series"
        if status:
            reason = f"server metrics: {status}"
        return fg.empty_figure(title, reason)
    data: list[dict[str, Any]] = []
    color = iter(COLORS * 4)
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
    prm = per_request_metrics(trace)
    ok = np.isfinite(prm.ttft_ns) & np.isfinite(sent)
    if ok.any():
        order = np.argsort(sent[ok], kind="stable")
        for name, arr in (("TTFT ms", prm.ttft_ns), ("E2E ms", prm.e2e_ns)):
            when, lat_ms = sent[ok][order], arr[ok][order] / 1e6
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
