"""A request's stored values of the registry's per-request metrics: a metric with a column
(``Metric.column``: TTFT in ``ttft_ns``) reads it; one derived from other columns
(``Metric.from_row``: user-perceived TTFT) computes it; any other is in the request's
``metric_values`` JSON (metric key -> base-unit value), written at ingest from
``PerRequestMetrics.extra``. So a new per-request metric needs no migration."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from app.analysis.metric_defs import Metric

F64 = npt.NDArray[np.float64]


def json_rows(extra: Mapping[str, npt.ArrayLike], n: int) -> list[dict[str, float] | None]:
    """``metric_values`` of ``n`` requests from per-metric arrays aligned with them: each
    request's finite values by key, None where it has none."""
    rows: list[dict[str, float] | None] = [None] * n
    for key, arr in extra.items():
        a = np.asarray(arr, np.float64)
        if a.shape != (n,):
            raise ValueError(
                f"metrics.extra[{key!r}] has shape {a.shape}, expected ({n},): metrics must be "
                "aligned with the records passed (one value per record, warm-ups included)"
            )
        for i in np.flatnonzero(np.isfinite(a)).tolist():
            row = rows[i]
            if row is None:
                row = rows[i] = {}
            row[key] = float(a[i])
    return rows


def stored_values(row: Mapping[str, Any]) -> dict[str, float]:
    """The request's ``metric_values``: its numbers by key (anything else left out)."""
    raw = row.get("metric_values")
    if not isinstance(raw, dict):
        return {}
    return {
        str(k): float(v)
        for k, v in raw.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def stored_value(m: Metric, row: Mapping[str, Any]) -> float | None:
    """A stored request's value of per-request metric ``m`` in its base unit (ns), or None."""
    if m.column is not None:
        v = row.get(m.column)
        return None if v is None else float(v)
    if m.from_row is not None:
        return m.from_row(row)
    return stored_values(row).get(m.key)


def shown_value(m: Metric, row: Mapping[str, Any]) -> float | None:
    """``stored_value`` in the metric's unit (ms)."""
    v = stored_value(m, row)
    return None if v is None else v / m.per_unit
