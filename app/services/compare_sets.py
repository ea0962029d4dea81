"""Comparisons of a set of runs or sweeps with a baseline the user picks: the baseline is
the one given, else the **oldest** (created first), never the order the ids came in (a list
sorted newest first would make the newest the baseline and flip every verdict). Sweeps: the
baseline against each other sweep, step by step (``compare.compare_sweeps``)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.analysis.comparability import KEY_FIELDS
from app.analysis.compare import combine_verdicts
from app.services import compare as compare_svc
from app.services.errors import Invalid, NotFound
from app.storage import compare_repo
from app.storage import repository as repo
from app.storage.db import session_scope

CHOSEN = "chosen"
OLDEST = "the oldest"


def choose_baseline(
    created: Mapping[str, datetime], baseline: str | None, *, what: str = "runs"
) -> tuple[str, list[str], str]:
    """(baseline, the others in their given order, how it was chosen) among ``created`` (id
    -> creation time, in the order given): ``baseline`` when given (422 naming ``baseline``
    when it is not among them), else the oldest (the first given among equals)."""
    ids = list(created)
    if baseline:
        if baseline not in created:
            raise Invalid(
                f"baseline {baseline!r} is not one of the {what} compared ({', '.join(ids)})",
                loc=("query", "baseline"),
            )
        base, how = baseline, CHOSEN
    else:
        base, how = min(ids, key=lambda i: (created[i], ids.index(i))), OLDEST
    return base, [i for i in ids if i != base], how


def _check(ids: list[str], what: str, variable: str | None) -> None:
    """422 naming the field, before anything is read: the count, the variable under test."""
    if not compare_svc.MIN_RUNS <= len(ids) <= compare_svc.MAX_RUNS:
        raise Invalid(
            f"compare {compare_svc.MIN_RUNS} to {compare_svc.MAX_RUNS} {what} at once "
            f"(got {len(ids)})",
            loc=("query", "ids" if what == "runs" else "sweeps"),
        )
    if variable is not None and variable not in KEY_FIELDS:
        raise Invalid(
            f"unknown key field {variable!r}; expected one of {list(KEY_FIELDS)}",
            loc=("query", "variable"),
        )


def sweeps_created(sessions: sessionmaker[Session], sweep_ids: list[str]) -> dict[str, datetime]:
    """Sweep id -> when it was created, in the order given (404 naming an unknown one)."""
    out: dict[str, datetime] = {}
    with session_scope(sessions) as s:
        for sid in sweep_ids:
            sweep = compare_repo.find_sweep(s, sid)
            if sweep is None:
                raise NotFound(f"no sweep with id {sid!r}")
            out[sid] = sweep.created_at
    return out


def runs_created(sessions: sessionmaker[Session], run_ids: list[str]) -> dict[str, datetime]:
    """Run id -> when it was created, in the order given (404 naming an unknown one)."""
    out: dict[str, datetime] = {}
    with session_scope(sessions) as s:
        for rid in run_ids:
            row = repo.find_run(s, rid)
            if row is None:
                raise NotFound(f"no run with id {rid!r}")
            out[rid] = row.created_at
    return out


def compare_run_set(
    sessions: sessionmaker[Session],
    run_ids: list[str],
    *,
    baseline: str | None = None,
    threshold_pct: float = 5.0,
    alpha: float = 0.01,
    variable: str | None = None,
) -> dict[str, Any]:
    """2 to 6 runs against the baseline picked (``choose_baseline``); the result of
    ``compare.compare_runs`` with ``baseline_chosen`` ("chosen" or "the oldest")."""
    ids = compare_svc.unique_ids(run_ids)
    _check(ids, "runs", variable)
    base, others, how = choose_baseline(runs_created(sessions, ids), baseline)
    out = compare_svc.compare_runs(
        sessions, base, others, threshold_pct=threshold_pct, alpha=alpha, variable=variable
    )
    return out | {"baseline_chosen": how}


def compare_sweep_set(
    sessions: sessionmaker[Session],
    sweep_ids: list[str],
    *,
    baseline: str | None = None,
    threshold_pct: float = 5.0,
    alpha: float = 0.01,
    variable: str | None = None,
) -> dict[str, Any]:
    """2 to 6 sweeps: the baseline picked (``choose_baseline``) against each other sweep,
    one ``compare.compare_sweeps`` result each (``comparisons``, in the order given); the
    steps that cannot be trusted are flagged in each (``untrusted_loads``) and listed by
    sweep in ``untrusted``."""
    ids = compare_svc.unique_ids(sweep_ids)
    _check(ids, "sweeps", variable)
    base, others, how = choose_baseline(sweeps_created(sessions, ids), baseline, what="sweeps")
    comparisons = [
        compare_svc.compare_sweeps(
            sessions, base, other, threshold_pct=threshold_pct, alpha=alpha, variable=variable
        )
        for other in others
    ]
    return {
        "kind": "sweep_set",
        "baseline": base,
        "baseline_chosen": how,
        "candidates": others,
        "threshold_pct": threshold_pct,
        "alpha": alpha,
        "comparisons": comparisons,
        "untrusted": {
            c["candidate"]: c["untrusted_loads"] for c in comparisons if c["untrusted_loads"]
        },
        "verdict": combine_verdicts([c["verdict"] for c in comparisons]),
    }
