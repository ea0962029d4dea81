"""A running run's latency percentiles as time series (pure): the requests stored so far,
grouped by the time they ended (s in the run) into consecutive windows of equal width
(at least ``MIN_WIDTH_S``, as many as ``MAX_WINDOWS`` at most), and in each window the
percentiles of the successful ones (linear interpolation, as everywhere). A window with no
value gives None (a gap in the line), never 0."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from app.analysis.percentiles import percentiles

MAX_WINDOWS = 60
MIN_WIDTH_S = 1.0
LIVE_PS: tuple[float, ...] = (50.0, 90.0, 99.0)


def window_width(span_s: float, *, max_windows: int = MAX_WINDOWS) -> float:
    """The windows' width for ``span_s`` seconds: whole seconds, at least ``MIN_WIDTH_S``."""
    return max(MIN_WIDTH_S, float(math.ceil(span_s / max_windows)))


def windowed_percentiles(
    end_s: npt.ArrayLike,
    values: npt.ArrayLike,
    ok: npt.ArrayLike,
    *,
    ps: Sequence[float] = LIVE_PS,
    max_windows: int = MAX_WINDOWS,
) -> dict[str, Any]:
    """``{"t_s": [window end, ...], "width_s": w, "p50": [...], ...}`` of ``values`` over
    the requests with ``ok`` and a finite value and end time (``end_s`` < 0: unknown)."""
    t = np.asarray(end_s, np.float64)
    v = np.asarray(values, np.float64)
    keep = np.asarray(ok, bool) & np.isfinite(v) & np.isfinite(t) & (t >= 0)
    t, v = t[keep], v[keep]
    keys = [f"p{p:g}" for p in ps]
    if t.size == 0:
        return {"t_s": [], "width_s": None, **{k: [] for k in keys}}
    width = window_width(float(t.max()), max_windows=max_windows)
    n = int(t.max() // width) + 1
    idx = np.minimum((t // width).astype(np.int64), n - 1)
    order = np.argsort(idx, kind="stable")
    bounds = np.searchsorted(idx[order], np.arange(n + 1))
    out: dict[str, Any] = {"t_s": [(i + 1) * width for i in range(n)], "width_s": width}
    cols: dict[str, list[float | None]] = {k: [] for k in keys}
    for i in range(n):
        got = percentiles(v[order[bounds[i] : bounds[i + 1]]], ps)
        for k, p in zip(keys, ps, strict=True):
            cols[k].append(got[float(p)])
    return out | cols
