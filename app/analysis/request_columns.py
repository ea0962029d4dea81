"""A run's per-request values without its events: what goodput under any SLO, the
diagnosis and the server-metrics overlay need (one row per measured request)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.analysis.metrics import per_request_metrics, valid_requests
from app.analysis.phases import user_ttft_ns
from app.domain import PerRequestMetrics, RunTrace

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
BoolArr = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class RequestColumns:
    """Per-request arrays aligned with the run's ``RunTrace`` (ordered by index)."""

    sent_ns: I64  # -1 where never sent
    end_ns: I64  # -1 where unknown
    input_tokens: I64  # -1 where unknown
    valid: BoolArr  # ``valid_requests``: ok and sent
    prm: PerRequestMetrics
    user_ttft_ns: F64 | None  # None when the run recorded no connection phases

    @property
    def n_requests(self) -> int:
        return int(self.sent_ns.shape[0])


def request_columns(trace: RunTrace, prm: PerRequestMetrics | None = None) -> RequestColumns:
    """The per-request values of ``trace`` (``prm``: its ``per_request_metrics`` if known)."""
    p = prm if prm is not None else per_request_metrics(trace)
    user = user_ttft_ns(p.ttft_ns, trace.phases) if trace.phases is not None else None
    return RequestColumns(
        sent_ns=trace.sent_ns,
        end_ns=trace.end_ns,
        input_tokens=trace.input_tokens,
        valid=valid_requests(trace),
        prm=p,
        user_ttft_ns=user,
    )
