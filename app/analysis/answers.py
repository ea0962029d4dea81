"""Runs of surfaces that generate no tokens (embeddings, rerank: ``app.client.endpoints``):
each successful request has one ``ANSWER`` event, the whole answer, whose tokens column
holds the items it answered (inputs embedded, documents scored).

* E2E latency of such a request = its answer's arrival - sent (``answer_end_times``); it
  has no token events, so TTFT, TTFOT, TPOT and ITL do not apply (``NO_TOKENS``), and there
  are no output tokens (output throughput does not apply either);
* items/s = items of the successful requests / the window (``items_answered``);
* input token throughput = input tokens of the successful requests / the window (every run).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from app.domain import EventKind, RunTrace

I64 = npt.NDArray[np.int64]
BoolArr = npt.NDArray[np.bool_]

NO_TOKENS = (
    "not applicable: this run's answers carry no generated tokens (embeddings, rerank): "
    "E2E latency is each answer's"
)


def _answer_mask(trace: RunTrace) -> BoolArr:
    out: BoolArr = trace.ev_kind == EventKind.ANSWER
    return out


def has_answers(trace: RunTrace) -> bool:
    """The run has answers of a surface that generates no tokens."""
    return bool(_answer_mask(trace).any())


def answer_end_times(trace: RunTrace) -> I64:
    """Per request, the arrival time of its last ANSWER event (-1 where it has none)."""
    mask = _answer_mask(trace)
    out = np.full(trace.n_requests, -1, np.int64)
    idx = np.flatnonzero(mask)
    if idx.size == 0:
        return out
    req = np.searchsorted(trace.ev_offsets, idx, side="right") - 1
    out[req] = trace.ev_t_ns[idx]  # in event order: a request's last answer is kept
    return out


def items_answered(trace: RunTrace, ok: BoolArr) -> int | None:
    """The items the successful requests' answers carried; None when the run has none."""
    mask = _answer_mask(trace)
    if not bool(mask.any()):
        return None
    req = np.searchsorted(trace.ev_offsets, np.flatnonzero(mask), side="right") - 1
    tokens = trace.ev_tokens[mask].astype(np.int64)
    return int(np.clip(tokens[ok[req]], 0, None).sum())
