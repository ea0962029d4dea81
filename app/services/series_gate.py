"""The gate of a series: a run judged against the runs of its series before it
(``app.analysis.series.gate``) and against the series' threshold alerts, for ``tokentrace
compare RUN --series NAME`` and ``GET /api/v1/series/{name}/gate``. A run that cannot be
trusted, or whose key differs from the series', gets no verdict unless asked
(``allow_invalid``), as a comparison does."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.analysis import series as sa
from app.analysis.compare import combine_verdicts
from app.services import series as series_svc
from app.services.errors import Conflict, Invalid, NotFound
from app.storage import series as series_repo
from app.storage.db import session_scope


def gate(
    sessions: sessionmaker[Session],
    name: str | None,
    run_id: str,
    *,
    metrics: list[str],
    threshold_pct: float = 5.0,
    allow_invalid: bool = False,
) -> dict[str, Any]:
    """The run's verdict against its series (``name``: the run's own series when None)."""
    if not (threshold_pct >= 0 and threshold_pct == threshold_pct):
        raise Invalid("threshold_pct must be a non-negative number", loc=("query", "threshold_pct"))
    refs = [series_svc.parse_ref(m) for m in metrics]
    with session_scope(sessions) as s:
        member = series_repo.member_of_run(s, run_id)
        if name is None:
            if member is None:
                raise NotFound(f"run {run_id!r} is in no series: name one with --series")
            row = series_repo.get_series(s, member.series_id)
            assert row is not None
            name = row.name
        row = series_svc.get(s, name)
        if member is None or member.series_id != row.id:
            raise Conflict(f"run {run_id!r} is not in series {name!r}", loc=("query", "run_id"))
        state, reason, issues, track = (
            member.state, member.reason, list(member.trust_issues), member.track,
        )  # fmt: skip
        baseline_run = row.baseline_run_id
        rules = [
            (sa.MetricRef(r.metric, r.stat), r.max_value, r.max_relative)
            for r in series_repo.alerts(s, row.id)
        ]
        series_id = row.id
    if state == "pending":
        raise Conflict(f"run {run_id!r} has not finished: judge it once it has")
    if state == "refused":
        raise Conflict(f"series {name!r} refused run {run_id!r}: {reason}")
    caveats = list(issues) + ([f"flagged: {reason}"] if state == "flagged" else [])
    if caveats and not allow_invalid:
        more = f" (and {len(caveats) - 1} more)" if len(caveats) > 1 else ""
        raise Conflict(f"no verdict: {caveats[0]}{more}; allow_invalid judges it anyway")
    results = []
    for ref in refs:
        with session_scope(sessions) as s:
            rows = series_repo.members(s, series_id, cell=(ref.key, ref.stat))
        t = sa.trend(series_svc.trend_members(rows), ref, track=track)
        idx = next(i for i, m in enumerate(t.runs) if m.run_id == run_id)
        value = (t.values[idx], t.lows[idx], t.highs[idx])
        base = sa.baseline_value(t, baseline_run)
        breaches = [
            why
            for r, max_value, max_rel in rules
            if r == ref
            for why in sa.threshold_breaches(
                value[0], better=ref.better, absolute=max_value, relative=max_rel,
                baseline=None if run_id == baseline_run else base,
            )
        ]  # fmt: skip
        res = sa.gate(
            ref, value, sa.history_before(t, idx), threshold=threshold_pct / 100.0,
            breaches=breaches,
        )  # fmt: skip
        results.append(res.to_dict())
    verdicts = [r["verdict"] for r in results]
    return {
        "series": name,
        "run_id": run_id,
        "track": track,
        "state": state,
        "threshold_pct": threshold_pct,
        "caveats": caveats,
        "results": results,
        "verdict": combine_verdicts(verdicts) if verdicts else "no data",
        "rule": "regressed when worse than the median of the run's earlier segment by at "
        f"least {threshold_pct:g}% with its interval wholly beyond that median, or when it "
        "breaks a threshold alert of the series",
    }
