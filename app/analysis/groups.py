"""A run of several models or targets (``app.client.routing``): its metrics per model and per
target beside the run's (pure).

Over the measured requests that name a model (``RequestRecord.model``) or a target
(``RequestRecord.target``), one row per name, in the order first seen by request index:
requests, ok and failed (not OK: error, timeout, cancelled), TTFT p50 and p99 and TPOT p50
over the group's successful requests (the registry's per-request values, linear-interpolation
percentiles), and its output tokens per second: the output tokens of its successful requests
over the whole run's window (``run_counts.default_window``: first send to last end), so the
groups' rates add up to the run's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from app.analysis.metric_defs import TPOT, TTFT
from app.analysis.metrics import basis, default_window, per_request_values
from app.analysis.percentiles import percentile
from app.domain import RequestRecord, trace_from_records

STATS_KEY = "groups"  # load_stats[STATS_KEY] = {"model": [...], "target": [...]}
DIMENSIONS = ("model", "target")
COLUMNS = (
    "requests",
    "ok",
    "failed",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "tpot_p50_ms",
    "output_tokens",
    "output_tok_s",
)


def _ms(values: np.ndarray, p: float) -> float | None:
    return percentile(values[np.isfinite(values)], p)


def group_tables(records: Sequence[RequestRecord]) -> dict[str, list[dict[str, Any]]]:
    """{"model": rows, "target": rows} for the dimensions some measured request names;
    {} for a run of one model and one target."""
    recs = [r for r in records if not r.warmup]
    names = {d: [getattr(r, d) for r in recs] for d in DIMENSIONS}
    wanted = [d for d in DIMENSIONS if any(n is not None for n in names[d])]
    if not wanted:
        return {}
    trace = trace_from_records(recs)
    b = basis(trace, ci=False)
    values = per_request_values(b)
    ttft = values[TTFT.key] / TTFT.per_unit
    tpot = values[TPOT.key] / TPOT.per_unit
    ok = np.asarray(b.valid, bool)
    tokens = np.clip(np.asarray(b.n_tokens, np.float64), 0, None)
    window = default_window(trace)
    span_s = (window.end_ns - window.start_ns) / 1e9 if window is not None else 0.0
    out: dict[str, list[dict[str, Any]]] = {}
    for d in wanted:
        keys = np.array(["" if n is None else n for n in names[d]], dtype=object)
        rows: list[dict[str, Any]] = []
        for name in dict.fromkeys(n for n in names[d] if n is not None):
            sel = keys == name
            good = sel & ok
            out_tokens = int(tokens[good].sum())
            rows.append(
                {
                    d: name,
                    "requests": int(sel.sum()),
                    "ok": int(good.sum()),
                    "failed": int(sel.sum() - good.sum()),
                    "ttft_p50_ms": _ms(ttft[good], 50),
                    "ttft_p99_ms": _ms(ttft[good], 99),
                    "tpot_p50_ms": _ms(tpot[good], 50),
                    "output_tokens": out_tokens,
                    "output_tok_s": out_tokens / span_s if span_s > 0 else None,
                }
            )
        out[d] = rows
    return out
