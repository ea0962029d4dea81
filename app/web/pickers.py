"""The runs and sweeps a page offers in a picker instead of a typed id: the concurrency runs
and sweeps of throughput-vs-batch, the runs the Roofline can place. Newest first, bounded,
and only those the page can use (a run without a concurrency gives no batch point)."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy.orm import Session

from app.analysis.metric_defs import OUTPUT_THROUGHPUT
from app.storage import compare_repo
from app.storage import repository as repo
from app.storage.models import Run

ID = re.compile(r"[0-9A-Za-z_-]{1,64}")  # what run and sweep ids are made of, and their bound
SCANNED = 300  # newest runs looked at
LISTED = 100  # offered at most
SWEEPS_SCANNED = 100
FINISHED = ("succeeded", "partial")


def valid_id(value: str) -> bool:
    """A run or sweep id as this server makes them: letters, digits, ``_`` and ``-``, at
    most 64 (a NUL byte or a megabyte of text never reaches a query)."""
    return ID.fullmatch(value) is not None


def bad_ids(values: list[str], field: str) -> tuple[list[str], list[str]]:
    """The well-formed ids, and a message naming ``field`` for each other one."""
    good = [v for v in values if valid_id(v)]
    errors = [f"{field}: not an id: {v[:40]!r}" for v in values if not valid_id(v)]
    return good, errors


def gives_batch_point(run: Run) -> bool:
    """Throughput vs batch plots a run at its ``max_concurrency`` by its output throughput
    (``app.services.probes.scaling_data``): both must be recorded."""
    spec, summary = run.spec or {}, run.summary or {}
    return bool(spec.get("max_concurrency")) and bool(summary.get(OUTPUT_THROUGHPUT.key))


def gives_roofline_point(run: Run) -> bool:
    """The Roofline places a run from its spec's input length and its summary (a decode
    point needs its concurrency and output length too; ``run_points`` says what is
    missing): a finished run that tokentrace ran, not an import."""
    return str(run.status) in FINISHED and bool((run.spec or {}).get("input_len"))


def run_option(run: Run) -> dict[str, Any]:
    spec = run.spec or {}
    conc = spec.get("max_concurrency")
    label = f"{run.name or run.id} ({run.id})" if run.name else run.id
    detail = [str(spec.get("model") or "")]
    if conc:
        detail.append(f"concurrency {conc}")
    return {"id": run.id, "label": label, "detail": " · ".join(d for d in detail if d)}


def _runs(s: Session, keep: Any) -> list[dict[str, Any]]:
    rows = [r for r in repo.list_runs(s, limit=SCANNED) if keep(r)]
    return [run_option(r) for r in rows[:LISTED]]


def batch_runs(s: Session) -> list[dict[str, Any]]:
    return _runs(s, gives_batch_point)


def roofline_runs(s: Session) -> list[dict[str, Any]]:
    return _runs(s, gives_roofline_point)


def concurrency_sweeps(s: Session) -> list[dict[str, Any]]:
    """Concurrency sweeps with at least one step run that gives a batch point."""
    out = []
    for w in compare_repo.list_sweeps(s, limit=SWEEPS_SCANNED):
        if w.mode != "concurrencies":
            continue
        steps = [st for st in compare_repo.sweep_steps(s, w.id) if st.role == "step"]
        usable = [st for st in steps if gives_batch_point(repo.get_run(s, st.run_id))]
        if usable:
            label = f"{w.name} ({w.id})" if w.name else w.id
            out.append({"id": w.id, "label": label, "steps": len(usable)})
    return out


def sweep_step_runs(s: Session, sweep_id: str) -> list[str] | None:
    """The run ids of a sweep's load steps (probe steps left out); None: no such sweep."""
    if compare_repo.find_sweep(s, sweep_id) is None:
        return None
    return [st.run_id for st in compare_repo.sweep_steps(s, sweep_id) if st.role == "step"]
