"""Plotly figure builders for the probe pages: the Roofline, throughput-vs-batch and
device telemetry. Pure functions: plain data in, a figure dict out."""

from __future__ import annotations

import math
from typing import Any

from app.analysis.device_presets import DevicePreset
from app.analysis.roofline import OperatingPoint

Figure = dict[str, Any]
I_MIN, I_MAX = 0.1, 10_000.0  # FLOP/byte range drawn
DTYPE_COLORS = {
    "fp32": "#6d4c41",
    "tf32": "#8e24aa",
    "bf16": "#1565c0",
    "fp16": "#00897b",
    "fp8": "#ef6c00",
}


def _roof_xy(peak: float, bw: float) -> tuple[list[float], list[float]]:
    knee = peak / bw
    xs = [I_MIN, min(max(knee, I_MIN), I_MAX), I_MAX]
    return xs, [min(peak, x * bw) for x in xs]


def roofline_figure(
    measured: dict[str, Any] | None,
    datasheets: list[DevicePreset],
    probe_points: list[dict[str, Any]],
    operating: list[tuple[str, OperatingPoint]],
) -> Figure:
    """Measured roofs (solid), datasheet roofs (dashed, named "datasheet"), linear-probe
    points and runs' operating points. Without measured ceilings the title says the roofs
    are the datasheet's. A roof taken from a noisy measurement (``measured["spread"]``,
    ``app.analysis.probe_spread``) is named "(noisy)" and dash-dotted; noisy probe points
    are a trace of their own, open red circles named "(noisy)"."""
    data: list[dict[str, Any]] = []
    shapes: list[dict[str, Any]] = []
    if measured:
        c = measured.get("ceilings") or {}
        bw = c.get("bandwidth_bps")
        noisy = set(((measured.get("spread") or {}).get("ceilings")) or [])
        for dtype, peak in (c.get("flops") or {}).items():
            if not bw or not peak:
                continue
            xs, ys = _roof_xy(peak, bw)
            shaky = sorted(noisy & {dtype, "bandwidth"})
            line: dict[str, Any] = {"color": DTYPE_COLORS.get(dtype, "#333"), "width": 3}
            if shaky:
                line["dash"] = "dashdot"
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "x": xs,
                    "y": ys,
                    "name": f"measured {dtype} ({measured.get('label')})"
                    + (" (noisy)" if shaky else ""),
                    "line": line,
                    "hovertemplate": f"measured {dtype}: peak {peak / 1e12:.2f} TFLOP/s, "
                    f"bandwidth {bw / 1e9:.0f} GB/s, balance {peak / bw:.1f} FLOP/B"
                    + (
                        f"<br>NOT TRUSTED: {' and '.join(shaky)} from a noisy measurement"
                        if shaky
                        else ""
                    )
                    + "<extra>probe "
                    + str(measured.get("probe_id"))
                    + "</extra>",
                }
            )
            shapes.append(
                {
                    "type": "line",
                    "x0": peak / bw,
                    "x1": peak / bw,
                    "y0": 0,
                    "y1": 1,
                    "yref": "paper",
                    "line": {"dash": "dot", "width": 1, "color": DTYPE_COLORS.get(dtype, "#333")},
                }
            )
    for d in datasheets:
        for dtype, peak in d.flops.items():
            xs, ys = _roof_xy(peak, d.bandwidth_bps)
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "x": xs,
                    "y": ys,
                    "name": f"datasheet {d.name} {dtype}",
                    "line": {
                        "dash": "dash",
                        "width": 1.5,
                        "color": DTYPE_COLORS.get(dtype, "#999"),
                    },
                    "hovertemplate": f"{d.label} {dtype} datasheet: {peak / 1e12:.1f} TFLOP/s, "
                    f"{d.bandwidth_bps / 1e12:.2f} TB/s, balance "
                    f"{peak / d.bandwidth_bps:.0f} FLOP/B<br>source: {d.source}<extra></extra>",
                }
            )
    for noisy_points in (False, True):
        pts = [p for p in probe_points if bool(p.get("noisy")) == noisy_points]
        if not pts:
            continue
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": "linear probe (noisy)" if noisy_points else "linear probe",
                "x": [p["intensity"] for p in pts],
                "y": [p["flops_s"] for p in pts],
                "marker": {"symbol": "circle-open", "size": 9, "color": "#c62828"}
                if noisy_points
                else {"symbol": "circle", "size": 8, "color": "#37474f"},
                "text": [
                    f"{p['label']}: X[{p['m']},{p['k']}] x W[{p['k']},{p['n']}] {p['dtype']}<br>"
                    f"{p['median_ms']:.4f} ms median; {p['flops_s'] / 1e12:.3f} TFLOP/s, "
                    f"{p['bytes_s'] / 1e9:.1f} GB/s; intensity {p['intensity']:.1f} FLOP/B"
                    + (
                        f"<br>NOT TRUSTED: spread {float(p.get('spread') or 0):.0%} "
                        "between repetitions"
                        if noisy_points
                        else ""
                    )
                    for p in pts
                ],
                "hovertemplate": "%{text}<extra></extra>",
            }
        )
    for label, op in operating:
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": f"{label} {op.phase}",
                "x": [op.intensity],
                "y": [op.flops_s],
                "marker": {"symbol": "diamond" if op.phase == "decode" else "square", "size": 12},
                "text": [
                    f"{label} {op.phase}: {op.explanation}<br>achieved {op.flops_s / 1e12:.2f} "
                    f"TFLOP/s, {op.bytes_s / 1e9:.0f} GB/s; MFU "
                    f"{'—' if op.mfu is None else f'{op.mfu:.1%}'}, MBU "
                    f"{'—' if op.mbu is None else f'{op.mbu:.1%}'}"
                ],
                "hovertemplate": "%{text}<extra></extra>",
            }
        )
    title = "Roofline"
    if not measured and datasheets:
        title = f"Roofline: {', '.join(d.label for d in datasheets)} datasheet (not measured)"
    return {
        "data": data,
        "layout": {
            "title": {"text": title},
            "xaxis": {"type": "log", "title": {"text": "arithmetic intensity (FLOP/byte)"}},
            "yaxis": {"type": "log", "title": {"text": "attained performance (FLOP/s)"}},
            "shapes": shapes,
            "hovermode": "closest",
            "margin": {"t": 40, "r": 10},
            "legend": {"orientation": "h", "y": -0.2},
        },
    }


def scaling_figures(
    series: list[dict[str, Any]], sweep: list[dict[str, Any]], balance: float | None
) -> dict[str, Figure]:
    """tokens/s (total and per request) and TPOT and memory against batch; the knee
    marked; memory- and compute-bound regions shaded where a machine balance is known
    (decode intensity at batch B with 2-byte weights is about B FLOP/byte)."""
    tput: list[dict[str, Any]] = []
    lat: list[dict[str, Any]] = []
    shapes: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    bmax = 1.0
    for s in series:
        rows = s["rows"]
        b = [r["batch"] for r in rows]
        bmax = max([bmax, *b])
        tput.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": f"{s['label']} total",
                "x": b,
                "y": [r["tokens_per_s"] for r in rows],
                "hovertemplate": "batch %{x}: %{y:.1f} tok/s total<extra></extra>",
            }
        )
        tput.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "line": {"dash": "dot"},
                "name": f"{s['label']} per request",
                "x": b,
                "y": [r["per_request_tokens_per_s"] for r in rows],
                "hovertemplate": "batch %{x}: %{y:.1f} tok/s per request<extra></extra>",
            }
        )
        lat.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": f"{s['label']} TPOT",
                "x": b,
                "y": [r["tpot_ms"] for r in rows],
                "hovertemplate": "batch %{x}: TPOT %{y:.2f} ms<extra></extra>",
            }
        )
        mem = [r.get("peak_memory_bytes") for r in rows]
        if any(m is not None for m in mem):
            lat.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "yaxis": "y2",
                    "name": f"{s['label']} peak memory (GiB)",
                    "x": b,
                    "y": [None if m is None else m / 2**30 for m in mem],
                }
            )
        knee = (s.get("knee") or {}).get("batch")
        if knee:
            shapes.append(
                {
                    "type": "line",
                    "x0": knee,
                    "x1": knee,
                    "y0": 0,
                    "y1": 1,
                    "yref": "paper",
                    "line": {"color": "#c62828", "dash": "dash"},
                }
            )
            notes.append(
                {
                    "x": math.log10(knee),
                    "y": 1,
                    "yref": "paper",
                    "showarrow": False,
                    "text": f"knee: batch {knee}",
                    "yanchor": "bottom",
                }
            )
    if sweep:
        b = [r["batch"] for r in sweep]
        bmax = max([bmax, *b])
        tput.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": "concurrency sweep",
                "x": b,
                "y": [r["tokens_per_s"] for r in sweep],
                "text": [r["run_id"] for r in sweep],
                "hovertemplate": "concurrency %{x}: %{y:.1f} tok/s (run %{text})<extra></extra>",
            }
        )
        lat.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": "sweep TPOT p50",
                "x": b,
                "y": [r["tpot_ms"] for r in sweep],
            }
        )
    regions: list[dict[str, Any]] = []
    if balance:
        regions = [
            {
                "type": "rect",
                "xref": "x",
                "yref": "paper",
                "x0": 0.5,
                "x1": balance,
                "y0": 0,
                "y1": 1,
                "fillcolor": "#1565c0",
                "opacity": 0.06,
                "line": {"width": 0},
            },
            {
                "type": "rect",
                "xref": "x",
                "yref": "paper",
                "x0": balance,
                "x1": max(bmax * 2, balance * 2),
                "y0": 0,
                "y1": 1,
                "fillcolor": "#ef6c00",
                "opacity": 0.06,
                "line": {"width": 0},
            },
        ]
        notes.append(
            {
                "x": math.log10(max(balance, 1)),
                "y": 0,
                "yref": "paper",
                "showarrow": False,
                "yanchor": "bottom",
                "text": f"decode turns compute-bound near batch {balance:.0f} (machine balance)",
            }
        )

    def layout(title: str, ytitle: str, y2: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "title": {"text": title},
            "xaxis": {"type": "log", "title": {"text": "batch / concurrency (requests)"}},
            "yaxis": {"title": {"text": ytitle}},
            "shapes": shapes + regions,
            "annotations": notes,
            "margin": {"t": 40, "r": 10},
            "legend": {"orientation": "h", "y": -0.2},
        }
        if y2:
            out["yaxis2"] = {
                "overlaying": "y",
                "side": "right",
                "title": {"text": "peak memory (GiB)"},
            }
        return out

    return {
        "throughput": {
            "data": tput,
            "layout": layout("Throughput vs batch", "throughput (tok/s)"),
        },
        "latency": {"data": lat, "layout": layout("TPOT and memory vs batch", "TPOT (ms)", True)},
    }


def telemetry_figure(samples: list[dict[str, Any]]) -> Figure:
    t = [s.get("t_s") for s in samples]
    keys = [
        ("util_pct", "utilization (%)", "y"),
        ("power_w", "power (W)", "y2"),
        ("mem_used_mb", "memory used (MiB)", "y3"),
        ("sm_clock_mhz", "SM clock (MHz)", "y4"),
    ]
    data = [
        {
            "type": "scatter",
            "mode": "lines",
            "name": label,
            "x": t,
            "y": [s.get(k) for s in samples],
            "yaxis": axis,
        }
        for k, label, axis in keys
    ]
    return {
        "data": data,
        "layout": {
            "title": {"text": "Device telemetry (about 1 Hz)"},
            "xaxis": {"title": {"text": "time since job start (s)"}, "domain": [0, 0.85]},
            "yaxis": {"title": {"text": "utilization (%)"}, "range": [0, 100]},
            "yaxis2": {"overlaying": "y", "side": "right", "title": {"text": "power (W)"}},
            "yaxis3": {
                "overlaying": "y",
                "side": "right",
                "position": 0.92,
                "anchor": "free",
                "title": {"text": "memory (MiB)"},
            },
            "yaxis4": {
                "overlaying": "y",
                "side": "right",
                "position": 1.0,
                "anchor": "free",
                "title": {"text": "SM clock (MHz)"},
            },
            "margin": {"t": 40},
            "legend": {"orientation": "h", "y": -0.2},
        },
    }
