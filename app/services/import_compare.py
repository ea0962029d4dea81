"""An imported file's own figures beside ours, computed under the file's tool's definitions
over the file's own window (the run page, the CLI report and the stored run summary)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from app.analysis.profiles import profile_metrics
from app.domain import RunTrace
from app.storage.interop import ImportInfo

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


def import_window(sent_ns: npt.NDArray[np.int64], window_s: float | None) -> tuple[int, int] | None:
    """The file's own duration from the first request's start (run-relative ns), or None."""
    sent = sent_ns[sent_ns >= 0]
    if window_s is None or sent.size == 0:
        return None
    start = int(sent.min())
    return start, start + round(window_s * NS_PER_S)


def import_metrics(info: ImportInfo, trace: RunTrace) -> dict[str, Any]:
    """Our metrics under the file's tool's definitions, over the file's window ({} when the
    file names no tool profile or the run has no request)."""
    if info.profile is None or not trace.n_requests:
        return {}
    window = import_window(trace.sent_ns, info.window_s)
    out: dict[str, Any] = profile_metrics(trace, info.profile, window_ns=window).to_dict()[
        "metrics"
    ]  # type: ignore[assignment]
    return out


def import_comparison(info: ImportInfo, trace: RunTrace, group_runs: list[str]) -> ImportComparison:
    """The file's figures, ours computed under its tool's definitions, and the difference."""
    return comparison_of(
        info, import_metrics(info, trace), import_window(trace.sent_ns, info.window_s), group_runs
    )


def comparison_of(
    info: ImportInfo,
    ours_metrics: dict[str, Any],
    window: tuple[int, int] | None,
    group_runs: list[str],
) -> ImportComparison:
    """``import_comparison`` from ``import_metrics`` already computed (a stored summary)."""
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
