"""The run page's steady-window section (``analysis.steady``): the window's start, end and
duration, and the window's figures beside the whole run's (the registry's page latencies
at p50 / p90 / p99 and its compared per-run rates)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.analysis.metric_defs import format_value
from app.web.runs_view import applying

STEADY_STATS = ("p50", "p90", "p99")


@dataclass(frozen=True, slots=True)
class SteadyRow:
    key: str  # the metric's key
    label: str  # "TTFT p99 (ms)"
    whole: str
    steady: str


@dataclass(frozen=True, slots=True)
class SteadyView:
    start_s: float | None
    end_s: float | None
    duration_s: float | None
    requests: int
    rule: str
    reason: str  # why there is none (window None)
    rows: list[SteadyRow]


def _stat(metrics: dict[str, Any], key: str, stat: str) -> float | None:
    d = metrics.get(key)
    if stat == "value":
        return d if isinstance(d, int | float) else None
    v = d.get(stat) if isinstance(d, dict) else None
    return v if isinstance(v, int | float) else None


def steady_view(report: dict[str, Any]) -> SteadyView | None:
    """The section's view model from the run's report (its ``steady`` block); None when the
    report has none (a report from before steady windows)."""
    block = report.get("steady")
    if not isinstance(block, dict):
        return None
    window = block.get("window")
    if not isinstance(window, dict):
        return SteadyView(None, None, None, 0, "", str(block.get("reason") or ""), [])
    whole, steady = report.get("metrics") or {}, block.get("metrics") or {}
    spec = report.get("spec")
    rows: list[SteadyRow] = []
    for m in applying("page", spec):
        for stat in STEADY_STATS:
            rows.append(
                SteadyRow(
                    m.key,
                    f"{m.label} {stat} ({m.unit})",
                    format_value(_stat(whole, m.key, stat), m.key),
                    format_value(_stat(steady, m.key, stat), m.key),
                )
            )
    for m in applying("compare", spec):
        if m.aggregation == "per_run":
            rows.append(
                SteadyRow(
                    m.key,
                    m.heading,
                    format_value(_stat(whole, m.key, "value"), m.key),
                    format_value(_stat(steady, m.key, "value"), m.key),
                )
            )
    return SteadyView(
        start_s=float(window["start_s"]),
        end_s=float(window["end_s"]),
        duration_s=float(window["duration_s"]),
        requests=int(block.get("requests") or 0),
        rule=str(window.get("rule") or ""),
        reason="",
        rows=rows,
    )
