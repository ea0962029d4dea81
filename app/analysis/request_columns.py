"""A run's per-request values without its events: what goodput under any SLO, the
diagnosis, comparisons and the server-metrics overlay need (one row per measured request).
``values`` holds every per-request metric of the registry by key (base unit, ns), so a new
metric travels with the stored summary without a change here."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from app.analysis.metric_defs import RunBasis, metric
from app.analysis.metrics import basis, per_request_values
from app.domain import RunTrace

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
    n_tokens: I64  # output tokens used (-1 unknown)
    # metric key -> per-request values (ns); a metric the run did not record is absent
    # (user-perceived TTFT without connection phases)
    values: dict[str, F64]

    @property
    def n_requests(self) -> int:
        return int(self.sent_ns.shape[0])

    def ms(self, key: str) -> F64 | None:
        """A per-request metric's values in its unit (ms), or None when not recorded."""
        v = self.values.get(key)
        return None if v is None else v / metric(key).per_unit


def request_columns(trace: RunTrace, b: RunBasis | None = None) -> RequestColumns:
    """The per-request values of ``trace`` (``b``: its metrics' basis, if one is built)."""
    b = b if b is not None else basis(trace)
    return RequestColumns(
        sent_ns=trace.sent_ns,
        end_ns=trace.end_ns,
        input_tokens=trace.input_tokens,
        valid=b.valid,
        n_tokens=b.n_tokens.astype(np.int64),
        values=per_request_values(b),
    )
