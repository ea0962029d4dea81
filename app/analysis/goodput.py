"""Goodput's rule (SPEC §2): which successful requests meet every SLO in force, read from
the registry (``Metric.slo``): a request is good when it has every value a good request
needs (an E2E: it was answered) and each SLO's metric is defined and within its bound, an
undefined value meeting the SLOs that say so (an undefined TPOT, n < 2, as in vLLM, which
records TPOT 0 for such requests when checking goodput)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from .metric_defs import METRICS, slo_metrics

F64 = npt.NDArray[np.float64]
BoolArr = npt.NDArray[np.bool_]


def check_slos(slos_ms: Mapping[str, float] | None) -> dict[str, float]:
    """The SLOs (name -> ms) when every name is a metric's and every bound positive."""
    slos = dict(slos_ms or {})
    known = tuple(slo_metrics())
    for key, ms in slos.items():
        if key not in known:
            raise ValueError(f"unknown SLO {key!r}; expected one of {known}")
        if not ms > 0:
            raise ValueError(f"SLO {key} must be a positive number of ms, got {ms}")
    return slos


def good_requests(
    values: Mapping[str, F64 | None], ok: BoolArr, slos_ms: Mapping[str, float]
) -> BoolArr:
    """Successful requests (``ok``) meeting every SLO in force (ms). ``values``: metric key
    -> per-request values in the metric's base unit (ns), None where the run did not record
    what the metric needs (then its SLO is an error)."""
    good = ok.copy()
    for m in METRICS.values():
        v = values.get(m.key)
        if m.goodput_requires and v is not None:
            good &= np.isfinite(v)
    by_slo = slo_metrics()
    for name, ms in slos_ms.items():
        m = by_slo[name]
        v = values.get(m.key)
        if v is None:
            raise ValueError(f"a {name} SLO needs the requests' {m.requires}")
        within = v <= ms * m.per_unit
        if m.slo_undefined_passes:
            within |= np.isnan(v)
        good &= within
    return good


def slo_goodput(
    values: Mapping[str, F64 | None], ok: BoolArr, slos: Mapping[str, float]
) -> tuple[int | None, list[str]]:
    """(good requests, or None without SLOs or when one cannot be checked; notes) for
    checked ``slos``."""
    notes: list[str] = []
    by_slo = slo_metrics()
    for name in slos:
        m = by_slo[name]
        if values.get(m.key) is None:
            notes.append(f"no goodput: the {name} SLO needs {m.requires} ({m.no_data})")
    if notes or not slos:
        return None, notes
    return int(good_requests(values, ok, slos).sum()), notes
