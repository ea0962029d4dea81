"""Named series of runs (and sweeps): create and list them, let runs join, settle each run
when it finishes (its key checked against the series', its point stored), move runs in and
out, and read a series' trend with its change points. No SQL (``app.storage.series``), no
statistics of its own (``app.analysis.series``).

A run names its series when it is created (``join_run``; a sweep: ``join_sweep``, whose
step runs join as they finish); it stays *pending* until it finishes. ``settle_run``
(called by ``runs.store_summaries``, the one step every finished run takes, and by the
dashboard's alert loop for any left pending) computes the run's comparability key
(``app.analysis.comparability.comparability_key``, as a comparison does) and its point
from its report (no event decoded: its stored summary). The first run to settle gives the
series its key; a later run whose key differs in a field the series does not let vary is
*flagged* (kept, shown apart, not used for change points) or *refused* (kept out of the
trend), with the reason, as the series says (``on_mismatch``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from app.analysis import series as sa
from app.analysis.comparability import comparability_key
from app.analysis.metrics import metrics_with_slos
from app.analysis.percentiles import percentile
from app.analysis.verdict import run_trust_issues
from app.client.sweep_plan import step_label
from app.domain import RunStatus
from app.services import hardware, run_summaries
from app.services.errors import Conflict, Invalid, NotFound
from app.services.run_summaries import RunSummary
from app.storage import compare_repo
from app.storage import repository as repo
from app.storage import series as series_repo
from app.storage.db import session_scope
from app.storage.models import Run
from app.storage.models_series import Series

log = logging.getLogger(__name__)

ON_MISMATCH = ("flag", "refuse")
DEFAULT_VARY = ("engine_version",)
ACTIVE = (RunStatus.QUEUED, RunStatus.RUNNING)
SHOW_LIMIT = 5000  # runs a series page or trend reads, the newest


def checked_name(name: str, *, loc: tuple[str, ...] = ("body", "series")) -> str:
    """``name`` if valid, else ``Invalid`` (422) naming the field and the rule."""
    try:
        return sa.check_name(name)
    except ValueError as e:
        raise Invalid(str(e), loc=loc) from None


def series_dict(row: Series) -> dict[str, Any]:
    return {
        "id": row.id,
        "name": row.name,
        "created_at": row.created_at.isoformat(),
        "key": row.key,
        "key_run_id": row.key_run_id,
        "vary": list(row.vary or []),
        "on_mismatch": row.on_mismatch,
        "baseline_run_id": row.baseline_run_id,
        "note": row.note,
    }


def create(
    s: Session,
    name: str,
    *,
    vary: list[str] | None = None,
    on_mismatch: str = "flag",
    note: str | None = None,
) -> dict[str, Any]:
    """A new, empty series (409 when the name is taken)."""
    checked_name(name, loc=("body", "name"))
    if on_mismatch not in ON_MISMATCH:
        raise Invalid(
            f"on_mismatch must be one of {', '.join(ON_MISMATCH)}", loc=("body", "on_mismatch")
        )
    try:
        fields = sa.check_vary(list(DEFAULT_VARY if vary is None else vary))
    except ValueError as e:
        raise Invalid(str(e), loc=("body", "vary")) from None
    if series_repo.find_series(s, name) is not None:
        raise Conflict(f"a series named {name!r} exists already", loc=("body", "name"))
    return series_dict(
        series_repo.create_series(s, name, vary=fields, on_mismatch=on_mismatch, note=note)
    )


def ensure(s: Session, name: str, *, loc: tuple[str, ...] = ("body", "series")) -> Series:
    """The series named ``name``, created with the defaults when it does not exist yet."""
    checked_name(name, loc=loc)
    row = series_repo.find_series(s, name)
    if row is None:
        row = series_repo.create_series(s, name, vary=list(DEFAULT_VARY), on_mismatch="flag")
    return row


def get(s: Session, name: str) -> Series:
    row = series_repo.find_series(s, checked_name(name, loc=("path", "name")))
    if row is None:
        raise NotFound(f"no series named {name!r}")
    return row


def join_run(s: Session, name: str, run_id: str) -> None:
    """The run joins the series (created if new), pending until it finishes; in the
    caller's transaction (a run created with a series)."""
    row = ensure(s, name)
    run = repo.find_run(s, run_id)
    if run is None:
        raise NotFound(f"no run with id {run_id!r}")
    current = series_repo.member_of_run(s, run_id)
    if current is not None:
        if current.series_id == row.id:
            return
        raise Conflict(f"run {run_id!r} is in another series already", loc=("body", "run_id"))
    series_repo.add_member(s, row.id, run_id, run_created_at=run.created_at)


def join_sweep(s: Session, name: str, sweep_id: str) -> None:
    """The sweep's step runs join the series: those stored so far now, the others as they
    are stored (``settle_run``)."""
    row = ensure(s, name)
    if compare_repo.find_sweep(s, sweep_id) is None:
        raise NotFound(f"no sweep with id {sweep_id!r}")
    if series_repo.series_of_sweep(s, sweep_id) is None:
        series_repo.add_sweep(s, row.id, sweep_id)
    for run_id in series_repo.sweep_step_runs(s, sweep_id):
        if series_repo.member_of_run(s, run_id) is None:
            _add_step_member(s, row.id, run_id)


def _add_step_member(s: Session, series_id: str, run_id: str) -> bool:
    step = series_repo.step_of_run(s, run_id)
    run = repo.find_run(s, run_id)
    if step is None or run is None or step[3] != "step":
        return False
    load = math.inf if step[1] < 0 else step[1]
    series_repo.add_member(
        s, series_id, run_id, run_created_at=run.created_at, sweep_id=step[0],
        track=step_label(load, step[2]),  # type: ignore[arg-type]
    )  # fmt: skip
    return True


# ------------------------------------------------------------------------------ settling


@dataclass(frozen=True, slots=True)
class Settled:
    run_id: str
    series: str
    state: str
    reason: str | None


def _measured_p50(values: Any, ok: Any) -> float | None:
    arr = np.where(ok & (values >= 0), values, -1).astype(np.float64)
    return percentile(arr[arr >= 0], 50)


def _sweep_load_text(s: Session, sweep_id: str | None) -> str | None:
    """A sweep step's load shape in its key: the sweep's plan (as a sweep's key has it)."""
    if sweep_id is None:
        return None
    sweep = compare_repo.find_sweep(s, sweep_id)
    if sweep is None:
        return None
    if sweep.mode == "auto":
        return "sweep: auto"
    loads = ", ".join(f"{float(x):g}" for x in sweep.loads or [])
    return f"sweep: {sweep.mode} {loads}"


def run_key(
    s: Session, run: Run, summary: RunSummary, *, sweep_id: str | None = None
) -> dict[str, Any]:
    """The run's comparability key (``comparability_key`` with its measured median lengths,
    hardware and dataset file, as a comparison computes it)."""
    c = summary.columns
    stats = run.load_stats or {}
    return comparability_key(
        run.spec or {},
        measured_input_p50=_measured_p50(c.input_tokens, c.valid),
        measured_output_p50=_measured_p50(c.n_tokens, c.valid),
        hardware=hardware.run_hardware(s, run.id, run.load_stats),
        load=_sweep_load_text(s, sweep_id),
        dataset_source=stats.get("dataset_source"),
    )


def _run_trust(run: Run) -> list[str]:
    return run_trust_issues(
        {
            "id": run.id,
            "status": str(run.status),
            "client_limited": run.client_limited,
            "lost_requests": run.lost_requests,
            "spec": run.spec,
            "validity": run.validity,
            "summary": run.summary or {},
        }
    )


def _report_metrics(run: Run, summary: RunSummary) -> dict[str, Any]:
    """The run's report metrics under its own SLOs (``runs.summary_report``'s)."""
    c = summary.columns
    slos = dict((run.spec or {}).get("goodput") or {})
    return metrics_with_slos(summary.metrics, c.values, c.valid, slos)


def settle_run(
    sessions: sessionmaker[Session], run_id: str, *, summary: RunSummary | None = None
) -> Settled | None:
    """Settle the run's membership once it has finished (None: it is in no series, or
    still running). ``summary``: its page summary, when the caller holds it."""
    with session_scope(sessions) as s:
        member = series_repo.member_of_run(s, run_id)
        if member is None:
            step = series_repo.step_of_run(s, run_id)
            sid = series_repo.series_of_sweep(s, step[0]) if step is not None else None
            if sid is None or not _add_step_member(s, sid, run_id):
                return None
    with session_scope(sessions) as s:
        member = series_repo.member_of_run(s, run_id)
        run = repo.find_run(s, run_id)
        if member is None or run is None or run.status in ACTIVE:
            return None
        series_id, sweep_id = member.series_id, member.sweep_id
    if summary is None:
        summary = run_summaries.page_summary(sessions, run_id)
    with session_scope(sessions) as s:
        run = repo.get_run(s, run_id)
        row = series_repo.get_series(s, series_id)
        member = series_repo.member_of_run(s, run_id)
        if row is None or member is None:
            return None
        key = run_key(s, run, summary, sweep_id=sweep_id)
        point = sa.point_of(_report_metrics(run, summary))
        issues = _run_trust(run)
        if row.key is None or row.key_run_id == run_id:
            series_repo.set_key(s, row.id, key, run_id)
            diffs: list[dict[str, Any]] = []
        else:
            diffs = sa.key_mismatch(row.key, key, list(row.vary or []))
        state, reason = "member", None
        if diffs:
            state = "refused" if row.on_mismatch == "refuse" else "flagged"
            reason = sa.mismatch_reason(diffs)
        series_repo.settle_member(
            s, member.id, state=state, reason=reason, key=key, point=point,
            trusted=not issues, issues=issues,
        )  # fmt: skip
        return Settled(run_id, row.name, state, reason)


def settle_quietly(
    sessions: sessionmaker[Session], run_id: str, *, summary: RunSummary | None = None
) -> None:
    """``settle_run`` for a run's finalize: a failure is logged and the membership stays
    pending (the dashboard's loop settles it later); the run itself is never failed by it."""
    try:
        settle_run(sessions, run_id, summary=summary)
    except Exception:
        log.exception("run %s: its series membership could not be settled now", run_id)


def settle_pending(sessions: sessionmaker[Session]) -> int:
    """Settle every pending member whose run has finished; how many settled."""
    with session_scope(sessions) as s:
        run_ids = series_repo.pending_runs(s)
    done = 0
    for run_id in run_ids:
        if settle_run(sessions, run_id) is not None:
            done += 1
    return done


def move(sessions: sessionmaker[Session], run_id: str, name: str | None) -> dict[str, Any]:
    """Move a run into the series ``name`` (out of any other), or out of its series (None).
    A finished run is settled now; one the series refuses is a 409 naming why, and stays
    where it was."""
    with session_scope(sessions) as s:
        run = repo.find_run(s, run_id)
        if run is None:
            raise NotFound(f"no run with id {run_id!r}")
        before = series_repo.member_of_run(s, run_id)
        previous = None
        if before is not None:
            prev_series = series_repo.get_series(s, before.series_id)
            previous = prev_series.name if prev_series is not None else None
        if name is None:
            series_repo.remove_member(s, run_id)
            return {"run_id": run_id, "series": None, "previous": previous, "state": None}
        row = ensure(s, name, loc=("path", "name"))
        if before is not None and before.series_id == row.id and before.state != "refused":
            return {"run_id": run_id, "series": name, "previous": previous, "state": before.state}
        series_repo.remove_member(s, run_id)
        step = series_repo.step_of_run(s, run_id)
        track = "" if step is None else step_label(math.inf if step[1] < 0 else step[1], step[2])  # type: ignore[arg-type]
        series_repo.add_member(
            s, row.id, run_id, run_created_at=run.created_at,
            sweep_id=step[0] if step is not None else None, track=track,
        )  # fmt: skip
    settled = settle_run(sessions, run_id)
    if settled is not None and settled.state == "refused":
        with session_scope(sessions) as s:  # put it back as it was
            series_repo.remove_member(s, run_id)
            if before is not None:
                restored = series_repo.add_member(
                    s, before.series_id, run_id, run_created_at=before.run_created_at,
                    sweep_id=before.sweep_id, track=before.track,
                )  # fmt: skip
                series_repo.settle_member(
                    s, restored.id, state=before.state, reason=before.reason, key=before.key,
                    point=before.point, trusted=before.trusted, issues=list(before.trust_issues),
                )  # fmt: skip
        raise Conflict(f"series {name!r} refuses run {run_id!r}: {settled.reason}")
    return {
        "run_id": run_id,
        "series": name,
        "previous": previous,
        "state": settled.state if settled is not None else "pending",
        "reason": settled.reason if settled is not None else None,
    }


def set_baseline(s: Session, name: str, run_id: str | None) -> dict[str, Any]:
    row = get(s, name)
    if run_id is not None:
        member = series_repo.member_of_run(s, run_id)
        if member is None or member.series_id != row.id or member.state != "member":
            raise Invalid(
                f"run {run_id!r} is not a settled member of series {name!r}",
                loc=("body", "run_id"),
            )
    series_repo.set_baseline(s, row.id, run_id)
    return series_dict(row) | {"baseline_run_id": run_id}


# ------------------------------------------------------------------------------- reading


def member_dict(m: series_repo.MemberRow) -> dict[str, Any]:
    return {
        "run_id": m.run_id,
        "name": m.run_name,
        "status": m.run_status,
        "state": m.state,
        "reason": m.reason,
        "trusted": m.trusted,
        "trust_issues": list(m.trust_issues),
        "sweep_id": m.sweep_id,
        "track": m.track,
        "run_created_at": m.run_created_at.isoformat(),
        "added_at": m.added_at.isoformat(),
    }


def trend_members(rows: list[series_repo.MemberRow]) -> list[sa.Member]:
    return [
        sa.Member(
            run_id=m.run_id,
            label=m.run_name or m.run_id,
            created_at=m.run_created_at.isoformat(),
            state=m.state,
            reason=m.reason,
            trusted=m.trusted,
            issues=tuple(m.trust_issues),
            key=m.key,
            point=m.point,
            track=m.track,
            sweep_id=m.sweep_id,
        )
        for m in rows
    ]


def parse_ref(text: str | None, *, loc: tuple[str, ...] = ("query", "metric")) -> sa.MetricRef:
    if not text:
        return sa.DEFAULT_REF
    try:
        return sa.parse_metric(text)
    except ValueError as e:
        raise Invalid(str(e), loc=loc) from None


@dataclass(frozen=True, slots=True)
class SeriesView:
    series: dict[str, Any]
    members: list[series_repo.MemberRow]
    trend: sa.Trend
    tracks: list[str]


def load_view(
    sessions: sessionmaker[Session],
    name: str,
    ref: sa.MetricRef,
    *,
    track: str | None = None,
    limit: int = SHOW_LIMIT,
) -> SeriesView:
    """The series, its members (the newest ``limit``) and the trend of ``ref`` on
    ``track`` (default: its first) with change points. Reads no run summary, and of each
    member only the point's cell of ``ref`` (the keys: of the runs at change points)."""
    with session_scope(sessions) as s:
        row = get(s, name)
        info = series_dict(row)
        rows = series_repo.members(s, row.id, limit=limit, cell=(ref.key, ref.stat))
    members = trend_members(rows)
    found = sa.tracks(members)
    chosen = track if track is not None else (found[0] if found else "")
    if track is not None and track not in found and found:
        raise Invalid(f"series {name!r} has no track {track!r}", loc=("query", "track"))
    t = with_keys(sessions, sa.trend(members, ref, track=chosen))
    return SeriesView(info, rows, t, found)


def with_keys(sessions: sessionmaker[Session], t: sa.Trend) -> sa.Trend:
    """The trend with each change point's changed comparability fields, from the stored
    keys of the runs on either side (a trend read without keys)."""
    if not t.changes:
        return t
    wanted = sorted({c.run_before for c in t.changes} | {c.run_after for c in t.changes})
    with session_scope(sessions) as s:
        keys = series_repo.keys_of(s, wanted)
    changes = [
        dataclasses.replace(c, fields=sa.key_changes(keys.get(c.run_before), keys.get(c.run_after)))
        for c in t.changes
    ]
    return dataclasses.replace(t, changes=changes)


def latest_verdict(view: SeriesView) -> dict[str, Any] | None:
    """The newest counted run of the trend judged against the runs before it (the gate's
    rule at the default threshold): the series' current verdict."""
    t = view.trend
    counted = [i for i, c in enumerate(t.counted) if c]
    if not counted:
        return None
    last = counted[-1]
    value = (t.values[last], t.lows[last], t.highs[last])
    res = sa.gate(t.ref, value, sa.history_before(t, last), threshold=DEFAULT_GATE_THRESHOLD)
    return {"run_id": t.runs[last].run_id} | res.to_dict()


DEFAULT_GATE_THRESHOLD = 0.05


def list_all(s: Session) -> list[dict[str, Any]]:
    return [
        series_dict(c.series)
        | {
            "runs": sum(c.states.values()),
            "states": c.states,
            "last_run_at": c.last_run_at.isoformat() if c.last_run_at else None,
            "alerts": c.alerts,
            "failed_deliveries": c.failed_deliveries,
        }
        for c in series_repo.list_series(s)
    ]


def names(s: Session) -> list[str]:
    """Every series' name (the launch forms' picker)."""
    return [c.series.name for c in series_repo.list_series(s)]


def series_of_run(s: Session, run_id: str) -> dict[str, Any] | None:
    """The run's series, its state there and the reason (the run page's line)."""
    member = series_repo.member_of_run(s, run_id)
    if member is None:
        return None
    row = series_repo.get_series(s, member.series_id)
    if row is None:
        return None
    return {"name": row.name, "state": member.state, "reason": member.reason}
