"""Multi-turn sessions' metrics grouped by turn index (pure).

For each turn number (1-based, ``RequestRecord.turn``) over the measured requests: how many
were sent and succeeded, and over the successful ones TTFT, TTFT per prompt token (each
request's TTFT divided by its prompt tokens: with prefix caching it falls after turn 1, as
the history is already cached), TPOT and prompt tokens (mean, p50, p99; linear percentiles).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from app.analysis.metrics import per_request_metrics
from app.domain import RequestRecord, trace_from_records

NS_PER_MS = 1e6


def _stats(values: np.ndarray) -> dict[str, float | None]:
    v = values[np.isfinite(values)]
    if v.size == 0:
        return {"n": 0, "mean": None, "p50": None, "p99": None}
    p50, p99 = np.percentile(v, [50, 99])
    return {"n": int(v.size), "mean": float(v.mean()), "p50": float(p50), "p99": float(p99)}


def turn_table(records: Sequence[RequestRecord]) -> list[dict[str, object]]:
    """One row per turn number, ascending; empty when no measured request has a turn."""
    recs = [r for r in records if not r.warmup and r.turn is not None]
    if not recs:
        return []
    trace = trace_from_records(recs)
    prm = per_request_metrics(trace)
    turns = np.array([r.turn for r in recs], np.int64)
    ok = trace.ok
    inp = trace.input_tokens.astype(np.float64)
    inp[inp <= 0] = np.nan
    rows: list[dict[str, object]] = []
    for k in sorted(set(turns.tolist())):
        sel = (turns == k) & ok
        ttft = prm.ttft_ns[sel]
        rows.append(
            {
                "turn": int(k),
                "requests": int((turns == k).sum()),
                "ok": int(sel.sum()),
                "ttft_ms": _stats(ttft / NS_PER_MS),
                "ttft_per_prompt_token_ms": _stats(ttft / NS_PER_MS / inp[sel]),
                "tpot_ms": _stats(prm.tpot_ns[sel] / NS_PER_MS),
                "prompt_tokens": _stats(inp[sel]),
            }
        )
    return rows
