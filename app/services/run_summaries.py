"""A run's page summary: everything the run page shows that needs the run's events (the
metrics without SLOs, each definition profile's metrics, the figures, the import
comparison's metrics) plus the per-request values goodput and diagnosis need, and what a
comparison reads (a bounded, seeded sample of the pooled ITL gaps: ``ITL_SAMPLE_MAX``).

Computed from one decode of the events when a run finalizes (``store_summary``) and
stored versioned (``SUMMARY_VERSION``); the page of a finished run reads it back
(``fresh_summary``) and decodes no event. A missing or stale summary (another version,
another request count, another import window) is recomputed on the first view and stored.
Active runs build one per view (``summarize``), unstored.
"""

from __future__ import annotations

import io
import json
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from app.analysis.compare import SAMPLE_MAX, bounded
from app.analysis.metrics import compute_metrics, itl_samples_ms, per_request_metrics
from app.analysis.profiles import ALL_PROFILES, PROFILES, profile_metrics
from app.analysis.request_columns import RequestColumns, request_columns
from app.domain import PerRequestMetrics, RunTrace
from app.figures.runs import run_figures
from app.figures.scriptjson import plotly_json
from app.services.import_compare import import_metrics
from app.storage import interop as interop_repo
from app.storage import repository as repo
from app.storage import run_columns
from app.storage import summaries as summary_repo
from app.storage.db import session_scope
from app.storage.interop import ImportInfo

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
SUMMARY_VERSION = 4  # bump when what is stored (or how it is computed) changes (3: send lag
# without the queue wait, the queue-wait figure; 4: cancelled requests apart from failed)
PROFILE_NAMES = PROFILES  # the definition profiles the run page shows
STORED_PROFILES = ALL_PROFILES  # every profile a summary holds (vllm-legacy too: the API)
ITL_SAMPLE_MAX = SAMPLE_MAX  # ITL gaps kept for comparisons (a seeded subsample past it)
ITL_SAMPLE = "itl_sample_ms"  # its array in the stored columns (read only when asked)
_COLUMN_NAMES = ("sent_ns", "end_ns", "input_tokens", "valid")
_PRM_NAMES = ("ttft_ns", "ttfot_ns", "e2e_ns", "tpot_ns", "n_tokens")


@dataclass(frozen=True, slots=True)
class ImportPart:
    """Our metrics under an imported file's tool profile, over the file's window."""

    profile: str | None
    window_s: float | None
    metrics: dict[str, Any]

    def matches(self, info: ImportInfo) -> bool:
        """Whether this part was computed for the import as it is now."""
        return self.profile == info.profile and self.window_s == info.window_s


@dataclass(frozen=True, slots=True)
class RunSummary:
    metrics: dict[str, Any]  # compute_metrics(trace, slos_ms={}).to_dict()
    profiles: dict[str, dict[str, Any]]  # name -> profile_metrics(trace, name).to_dict()
    figures: dict[str, str]  # figure key -> Plotly JSON (run_figures)
    columns: RequestColumns
    n_events: int
    summary_only: bool
    imported: ImportPart | None = None
    itl_count: int = 0  # the run's pooled per-token ITL samples (``itl_samples_ms``)
    itl_sample_ms: F64 | None = None  # all of them, or a seeded subsample of ITL_SAMPLE_MAX
    # (``analysis.compare.bounded``); None when not read (``decode(itl_sample=False)``)

    @property
    def n_requests(self) -> int:
        return self.columns.n_requests


def summarize(
    trace: RunTrace,
    *,
    scheduled_ns: I64,
    turns: I64,
    indexes: I64,
    profiles: tuple[str, ...] = STORED_PROFILES,
    import_info: ImportInfo | None = None,
    itl_sample_max: int = ITL_SAMPLE_MAX,
) -> RunSummary:
    """The page summary of ``trace`` (pure). ``scheduled_ns`` / ``turns`` / ``indexes``:
    the schedule columns (``run_columns.schedule_columns``) and stored indexes the figures
    use."""
    prm = per_request_metrics(trace)
    n = trace.n_requests
    plots = run_figures(
        trace,
        scheduled_ns=scheduled_ns if n else None,
        turns=turns if n else None,
        indexes=indexes if indexes.shape[0] == n else None,
    )
    imported = None
    if import_info is not None:
        imported = ImportPart(
            import_info.profile, import_info.window_s, import_metrics(import_info, trace)
        )
    metrics = compute_metrics(trace, slos_ms={}).to_dict()
    profile_dicts = {p: profile_metrics(trace, p).to_dict() for p in profiles}
    figures = {key: plotly_json(fig) for key, fig in plots.figures.items()}
    del plots
    if trace.summary_only:  # no per-token times: no ITL (as the metrics say)
        itl, itl_count = np.zeros(0), 0
    else:
        itl, itl_count = bounded(itl_samples_ms(trace), itl_sample_max)
    return RunSummary(
        metrics=metrics,
        profiles=profile_dicts,
        figures=figures,
        columns=request_columns(trace, prm),
        n_events=trace.n_events,
        summary_only=trace.summary_only,
        imported=imported,
        itl_count=itl_count,
        itl_sample_ms=itl,
    )


# ------------------------------------------------------------------------------ encoding


def encode(summary: RunSummary) -> tuple[bytes, bytes]:
    """(payload, columns) for ``run_page_summaries``: compressed JSON and an ``.npz``.

    JSON as Python writes it (NaN kept, key order kept, floats round-trip exactly)."""
    imp = summary.imported
    body = {
        "metrics": summary.metrics,
        "profiles": summary.profiles,
        "figures": summary.figures,
        "n_events": summary.n_events,
        "summary_only": summary.summary_only,
        "itl_count": summary.itl_count,
        "imported": None
        if imp is None
        else {"profile": imp.profile, "window_s": imp.window_s, "metrics": imp.metrics},
    }
    payload = zlib.compress(json.dumps(body).encode(), 1)
    c = summary.columns
    arrays = {name: getattr(c, name) for name in _COLUMN_NAMES}
    arrays |= {name: getattr(c.prm, name) for name in _PRM_NAMES}
    if c.user_ttft_ns is not None:
        arrays["user_ttft_ns"] = c.user_ttft_ns
    if summary.itl_sample_ms is not None:
        arrays[ITL_SAMPLE] = summary.itl_sample_ms
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return payload, buf.getvalue()


def decode(payload: bytes, columns: bytes, *, itl_sample: bool = False) -> RunSummary:
    """The ``RunSummary`` that ``encode`` wrote; its ITL sample only with ``itl_sample``
    (a comparison reads it, a page does not)."""
    body = json.loads(zlib.decompress(payload))
    with np.load(io.BytesIO(columns), allow_pickle=False) as z:
        arr = {name: z[name] for name in z.files if itl_sample or name != ITL_SAMPLE}
    prm = PerRequestMetrics(**{name: arr[name] for name in _PRM_NAMES})
    cols = RequestColumns(
        **{name: arr[name] for name in _COLUMN_NAMES},
        prm=prm,
        user_ttft_ns=arr.get("user_ttft_ns"),
    )
    imp = body.get("imported")
    return RunSummary(
        metrics=body["metrics"],
        profiles=body["profiles"],
        figures=body["figures"],
        columns=cols,
        n_events=int(body["n_events"]),
        summary_only=bool(body["summary_only"]),
        imported=None
        if imp is None
        else ImportPart(imp["profile"], imp["window_s"], dict(imp["metrics"])),
        itl_count=int(body.get("itl_count", 0)),
        itl_sample_ms=arr.get(ITL_SAMPLE),
    )


# ------------------------------------------------------------------------------- storage


def compute_summary(
    s: Session, run_id: str, *, profiles: tuple[str, ...] = STORED_PROFILES
) -> RunSummary:
    """Decode the run's events once and summarize them (nothing stored)."""
    trace = repo.load_trace(s, run_id)
    sched, turns = run_columns.schedule_columns(s, run_id)
    indexes = run_columns.measured_indexes(s, run_id)
    info = interop_repo.get_import(s, run_id)
    return summarize(
        trace,
        scheduled_ns=sched,
        turns=turns,
        indexes=indexes,
        profiles=profiles,
        import_info=info,
    )


def put(s: Session, run_id: str, summary: RunSummary) -> None:
    payload, columns = encode(summary)
    summary_repo.put_summary(
        s,
        run_id,
        version=SUMMARY_VERSION,
        n_requests=summary.n_requests,
        payload=payload,
        columns=columns,
    )


def store_summary(sessions: sessionmaker[Session], run_id: str) -> RunSummary:
    """Compute the run's page summary from its events and store it (at finalize)."""
    with session_scope(sessions) as s:
        summary = compute_summary(s, run_id)
    with session_scope(sessions) as s:
        put(s, run_id, summary)
    return summary


def fresh_summary(s: Session, run_id: str, *, itl_sample: bool = False) -> RunSummary | None:
    """The run's stored page summary, or None when there is none or it is stale: another
    ``SUMMARY_VERSION``, another number of measured requests, another import profile or
    window than the run's import has now. ``itl_sample``: read its ITL sample too."""
    row = summary_repo.get_summary(s, run_id)
    if row is None or row.version != SUMMARY_VERSION:
        return None
    if row.n_requests != repo.count_requests(s, run_id, include_warmup=False):
        return None
    summary = decode(row.payload, row.columns, itl_sample=itl_sample)
    info = interop_repo.get_import(s, run_id)
    if info is not None and (summary.imported is None or not summary.imported.matches(info)):
        return None
    return summary


def page_summary(
    sessions: sessionmaker[Session], run_id: str, *, itl_sample: bool = False
) -> RunSummary:
    """A finished run's page summary: the stored one, else computed now and stored.
    ``itl_sample``: with its ITL sample (a summary computed now always has it)."""
    with session_scope(sessions) as s:
        found = fresh_summary(s, run_id, itl_sample=itl_sample)
    if found is not None:
        return found
    with session_scope(sessions) as s:
        summary = compute_summary(s, run_id)
    try:
        with session_scope(sessions) as s:
            put(s, run_id, summary)
    except IntegrityError:
        pass  # a concurrent view stored the same summary first (or the run was deleted)
    return summary
