"""A run's page summary: everything the run page shows that needs the run's events (the
metrics without SLOs, each definition profile's metrics, the figures, the import
comparison's metrics) plus the per-request values goodput and diagnosis need, and what a
comparison reads (a bounded, seeded sample of each compared pooled metric's samples, the
ITL gaps: ``ITL_SAMPLE_MAX``). The per-request values are every per-request metric of the
registry by key, so a new metric is stored here with no change and no migration.

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
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from app.analysis.compare import SAMPLE_MAX, bounded
from app.analysis.metric_defs import shown
from app.analysis.metrics import basis, compute_metrics
from app.analysis.profiles import ALL_PROFILES, PROFILES, profile_metrics
from app.analysis.request_columns import RequestColumns, request_columns
from app.analysis.steady import steady_metrics
from app.domain import RunTrace
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
SUMMARY_VERSION = 6  # bump when what is stored (or how it is computed) changes (3: send lag
# without the queue wait, the queue-wait figure; 4: cancelled requests apart from failed;
# 5: per-request values and pooled samples by metric key, from the registry; 6: the steady
# window and its metrics)
PROFILE_NAMES = PROFILES  # the definition profiles the run page shows
STORED_PROFILES = ALL_PROFILES  # every profile a summary holds (vllm-legacy too: the API)
ITL_SAMPLE_MAX = SAMPLE_MAX  # pooled samples kept for comparisons (a seeded subsample past it)
_COLUMN_NAMES = ("sent_ns", "end_ns", "input_tokens", "valid", "n_tokens")
VALUE = "value:"  # + metric key: a per-request metric's array in the stored columns
SAMPLE = "sample:"  # + metric key: a pooled metric's bounded samples (read only when asked)


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
    # each compared pooled metric (ITL): the run's count of its samples, and all of them in
    # its unit or a seeded subsample of ITL_SAMPLE_MAX (``analysis.compare.bounded``); the
    # samples are None when not read (``decode(itl_sample=False)``)
    sample_counts: dict[str, int] = field(default_factory=dict)
    samples: dict[str, F64] | None = None
    # the steady window and its metrics without SLOs (``analysis.steady.steady_metrics``)
    steady: dict[str, Any] = field(default_factory=dict)

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
    spec: dict[str, Any] | None = None,
) -> RunSummary:
    """The page summary of ``trace`` (pure). ``scheduled_ns`` / ``turns`` / ``indexes``:
    the schedule columns (``run_columns.schedule_columns``) and stored indexes the figures
    use; ``spec``: the run's spec (the load it asked, for its steady window)."""
    b = basis(trace)
    n = trace.n_requests
    steady = steady_metrics(trace, spec)
    window = steady.get("window")
    plots = run_figures(
        trace,
        scheduled_ns=scheduled_ns if n else None,
        turns=turns if n else None,
        indexes=indexes if indexes.shape[0] == n else None,
        steady_ns=(window["start_ns"], window["end_ns"]) if isinstance(window, dict) else None,
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
    samples: dict[str, F64] = {}
    counts: dict[str, int] = {}
    for m in shown("compare"):
        if m.samples is not None:
            samples[m.key], counts[m.key] = bounded(m.samples(b), itl_sample_max)
    return RunSummary(
        metrics=metrics,
        profiles=profile_dicts,
        figures=figures,
        columns=request_columns(trace, b),
        n_events=trace.n_events,
        summary_only=trace.summary_only,
        imported=imported,
        sample_counts=counts,
        samples=samples,
        steady=steady,
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
        "sample_counts": summary.sample_counts,
        "steady": summary.steady,
        "imported": None
        if imp is None
        else {"profile": imp.profile, "window_s": imp.window_s, "metrics": imp.metrics},
    }
    payload = zlib.compress(json.dumps(body).encode(), 1)
    c = summary.columns
    arrays = {name: getattr(c, name) for name in _COLUMN_NAMES}
    arrays |= {VALUE + key: v for key, v in c.values.items()}
    arrays |= {SAMPLE + key: v for key, v in (summary.samples or {}).items()}
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return payload, buf.getvalue()


def decode(payload: bytes, columns: bytes, *, itl_sample: bool = False) -> RunSummary:
    """The ``RunSummary`` that ``encode`` wrote; its pooled samples only with ``itl_sample``
    (a comparison reads them, a page does not)."""
    body = json.loads(zlib.decompress(payload))
    with np.load(io.BytesIO(columns), allow_pickle=False) as z:
        arr = {name: z[name] for name in z.files if itl_sample or not name.startswith(SAMPLE)}
    cols = RequestColumns(
        **{name: arr[name] for name in _COLUMN_NAMES},
        values={k.removeprefix(VALUE): v for k, v in arr.items() if k.startswith(VALUE)},
    )
    samples = {k.removeprefix(SAMPLE): v for k, v in arr.items() if k.startswith(SAMPLE)}
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
        sample_counts={str(k): int(n) for k, n in body["sample_counts"].items()},
        samples=samples if itl_sample else None,
        steady=dict(body.get("steady") or {}),
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
    spec = repo.get_run(s, run_id).spec
    return summarize(
        trace,
        scheduled_ns=sched,
        turns=turns,
        indexes=indexes,
        profiles=profiles,
        import_info=info,
        spec=spec if isinstance(spec, dict) else None,
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
