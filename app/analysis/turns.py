"""Multi-turn sessions' metrics grouped by turn index (pure).

For each turn number (1-based, ``RequestRecord.turn``) over the measured requests: how many
were sent and succeeded, and over the successful ones each metric the registry shows by
turn (``Metric.views`` "turns": TTFT, TPOT), TTFT per prompt token (each request's TTFT
divided by its prompt tokens: with prefix caching it falls after turn 1, as the history is
already cached) and prompt tokens (mean, p50, p99; linear percentiles).

Where the server reported the prompt tokens it served from its prefix cache
(``RequestRecord.cached_prompt_tokens``): their statistics over the successful requests that
reported them, and the cached share, the sum of those cached tokens over the sum of the same
requests' prompt tokens (the server's ``usage.prompt_tokens`` where given, else the prompt
count metrics use); ``cached_tokens_sum`` and ``cache_prompt_tokens_sum`` keep the two sums so
a run's share over every turn follows (``app.analysis.prefix_cache.responses_prefix_cache``).
None where no request of the turn reported a count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from app.analysis.metric_defs import TTFT, Metric, shown
from app.analysis.metrics import basis, per_request_values
from app.domain import RequestRecord, trace_from_records

F64 = npt.NDArray[np.float64]
PER_TOKEN = "ttft_per_prompt_token_ms"  # TTFT / prompt tokens, by turn


def turn_metrics() -> list[Metric]:
    """The metrics a turn's row summarises, in order."""
    return shown("turns")


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
    values = per_request_values(basis(trace))
    turns = np.array([r.turn for r in recs], np.int64)
    return turn_table_of(
        turns,
        trace.ok,
        {m.key: values[m.key] for m in turn_metrics()},
        trace.input_tokens,
        cached_prompt_tokens=_floats([r.cached_prompt_tokens for r in recs]),
        usage_prompt_tokens=_floats([r.usage_prompt_tokens for r in recs]),
    )


def _floats(values: Sequence[int | None]) -> npt.NDArray[np.float64]:
    return np.array([np.nan if v is None else float(v) for v in values], np.float64)


def _known(values: npt.ArrayLike | None, n: int) -> npt.NDArray[np.float64]:
    """Counts as floats, NaN where unknown (None, NaN or negative)."""
    if values is None:
        return np.full(n, np.nan)
    out = np.asarray(values, np.float64).copy()
    out[~(out >= 0)] = np.nan
    return out


def turn_table_of(
    turns: npt.NDArray[np.int64],
    ok: npt.NDArray[np.bool_],
    values: Mapping[str, F64],
    input_tokens: npt.ArrayLike,
    *,
    cached_prompt_tokens: npt.ArrayLike | None = None,
    usage_prompt_tokens: npt.ArrayLike | None = None,
) -> list[dict[str, object]]:
    """``turn_table`` from per-request columns (measured requests of a turn, aligned):
    status ok, each turn metric's values by key (base unit, ns; NaN where none), prompt
    tokens (<= 0 or NaN: unknown), and the server's cached and prompt token counts (NaN or
    negative: not reported; None: no request reported any), as a run's stored request rows
    give them (``app.storage.turn_rows``)."""
    inp = np.asarray(input_tokens, np.float64).copy()
    inp[~(inp > 0)] = np.nan
    cached = _known(cached_prompt_tokens, turns.shape[0])
    basis = _known(usage_prompt_tokens, turns.shape[0])
    basis = np.where(np.isnan(basis), inp, basis)  # the server's prompt count where given
    rows: list[dict[str, object]] = []
    for k in sorted(set(turns.tolist())):
        sel = (turns == k) & ok
        both = sel & np.isfinite(cached) & np.isfinite(basis)
        cached_sum, basis_sum = float(cached[both].sum()), float(basis[both].sum())
        row: dict[str, object] = {
            "turn": int(k),
            "requests": int((turns == k).sum()),
            "ok": int(sel.sum()),
        }
        for m in turn_metrics():
            shown_values = values[m.key][sel] / m.per_unit
            row[m.key] = _stats(shown_values)
            if m is TTFT:
                row[PER_TOKEN] = _stats(shown_values / inp[sel])
        rows.append(
            row
            | {
                "prompt_tokens": _stats(inp[sel]),
                "cached_prompt_tokens": _stats(cached[sel]),
                "cached_share": cached_sum / basis_sum if basis_sum > 0 else None,
                "cached_tokens_sum": int(cached_sum) if both.any() else None,
                "cache_prompt_tokens_sum": int(basis_sum) if both.any() else None,
            }
        )
    return rows


# the per-turn export's columns (``flat_rows``): each statistic as <quantity>_<stat>
STATS = ("mean", "p50", "p99")


def quantities() -> list[str]:
    """What a turn's row summarises, in order: each turn metric (TTFT followed by TTFT per
    prompt token), the prompt tokens and the cached prompt tokens."""
    out: list[str] = []
    for m in turn_metrics():
        out += [m.key, PER_TOKEN] if m is TTFT else [m.key]
    return [*out, "prompt_tokens", "cached_prompt_tokens"]


def csv_columns() -> tuple[str, ...]:
    """The per-turn export's columns."""
    stats = (f"{q}_{st}" for q in quantities() for st in STATS)
    return ("turn", "requests", "ok", *stats, "cached_share")


def flat_rows(table: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A turn table's rows with one column per statistic (``csv_columns``; None: no value)."""
    out: list[dict[str, Any]] = []
    for row in table:
        flat: dict[str, Any] = {c: row.get(c) for c in ("turn", "requests", "ok")}
        for q in quantities():
            stats = row.get(q)
            for st in STATS:
                flat[f"{q}_{st}"] = stats.get(st) if isinstance(stats, Mapping) else None
        flat["cached_share"] = row.get("cached_share")
        out.append(flat)
    return out
