"""Whether a run can be trusted: its status from its requests, the note saying why it failed,
and the issues that travel with it (client-limited, over its error bound, lost requests).

Pure functions; one rule for every place that decides a run's status (a local bench, a
worker's job on the server, an import):

* stopped before its end (Ctrl-C, a cancel) -> ``partial``;
* requests were sent and none succeeded -> ``failed``;
* error rate (failed / sent, warm-ups excluded) above ``max_error_rate`` -> ``partial``;
* any request lost (sent or recorded, never stored) -> ``partial``;
* otherwise ``succeeded``.

A run that lost requests is never valid, whatever its status (``run_trust_issues``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.domain import RequestRecord, RequestStatus, RunStatus

DEFAULT_MAX_ERROR_RATE = 0.05
NS_PER_S = 1_000_000_000


@dataclass(frozen=True, slots=True)
class RequestTally:
    """Measured requests: how many were sent and how many of them succeeded."""

    sent: int
    ok: int

    @property
    def failed(self) -> int:
        return self.sent - self.ok

    @property
    def error_rate(self) -> float | None:
        return self.failed / self.sent if self.sent else None


def tally(records: Sequence[RequestRecord]) -> RequestTally:
    """Sent / ok among the measured (non-warm-up) requests."""
    sent = [r for r in records if not r.warmup and r.sent_ns is not None]
    return RequestTally(len(sent), sum(1 for r in sent if r.status is RequestStatus.OK))


def over_error_bound(t: RequestTally, max_error_rate: float) -> bool:
    rate = t.error_rate
    return rate is not None and rate > max_error_rate


def run_status(
    t: RequestTally, *, stopped: bool, max_error_rate: float, lost: int = 0
) -> RunStatus:
    """The run's status from its requests (the module doc's rule; ``lost``: requests sent or
    recorded that were never stored)."""
    if stopped:
        return RunStatus.PARTIAL
    if t.sent and not t.ok:
        return RunStatus.FAILED
    if over_error_bound(t, max_error_rate) or lost > 0:
        return RunStatus.PARTIAL
    return RunStatus.SUCCEEDED


def error_kind(message: str | None, status: RequestStatus) -> str:
    """A failure's kind for summaries: the message without its phase in brackets
    ("connection refused (connect)" -> "connection refused"), or the status."""
    if not message:
        return str(status)
    head = message.split(" (", 1)[0].split(": ", 1)[0].strip()
    return head or str(status)


def failure_note(records: Sequence[RequestRecord], max_error_rate: float) -> str | None:
    """The note when the measured error rate exceeds ``max_error_rate``, e.g. "32 of 40
    requests failed (80%), mostly connection refused, from 15.2 s (error bound 5%)"; "from"
    is the run-relative time the first failure was seen (its end, else its send). None
    within the bound."""
    measured = [r for r in records if not r.warmup and r.sent_ns is not None]
    t = tally(records)
    if not over_error_bound(t, max_error_rate):
        return None
    failed = [r for r in measured if r.status is not RequestStatus.OK]
    kinds = Counter(error_kind(r.error, r.status) for r in failed)
    top, _n = sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))[0]
    seen = [r.end_ns if r.end_ns is not None else r.sent_ns for r in failed]
    first_s = min(s for s in seen if s is not None) / NS_PER_S
    pct = 100 * t.failed / t.sent
    return (
        f"{t.failed} of {t.sent} requests failed ({pct:.0f}%), mostly {top}, from {first_s:.1f} s "
        f"(error bound {max_error_rate:.0%})"
    )


def spec_error_bound(spec: Mapping[str, Any] | None) -> float:
    """A stored spec's ``max_error_rate`` (the default for runs stored before it existed
    and for imports, which have none)."""
    value = (spec or {}).get("max_error_rate")
    return float(value) if isinstance(value, int | float) else DEFAULT_MAX_ERROR_RATE


def lost_requests(run: Mapping[str, Any]) -> int:
    """The requests a stored run lost (sent or recorded, never stored): 0 when none."""
    value = run.get("lost_requests")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def lost_text(lost: int) -> str:
    """Why a run that lost requests is not valid, e.g. "lost 20 requests: they were sent
    but never stored, so its figures describe only part of what the target served"."""
    word = "request" if lost == 1 else "requests"
    return (
        f"lost {lost} {word}: sent but never stored, so its figures describe only part of "
        "what the target served"
    )


def run_trust_issues(run: Mapping[str, Any], error_rate: float | None = None) -> list[str]:
    """Why a stored run's figures cannot be trusted as they stand (empty: nothing known).

    ``run`` is a run as ``app.services.runs.run_dict`` gives it (``status``,
    ``client_limited``, ``lost_requests``, ``spec``, ``validity``), with its cached
    ``summary`` when there is one; ``error_rate`` overrides the summary's. Used by
    ``compare`` (which refuses such runs), by sweeps (which never pick such a step as max
    goodput) and by the pages."""
    name = str(run.get("id") or run.get("name") or "the run")
    issues: list[str] = []
    status = str(run.get("status") or "")
    if status == RunStatus.FAILED:
        issues.append(f"run {name} failed: no measured request succeeded")
    elif status in (RunStatus.QUEUED, RunStatus.RUNNING):
        issues.append(f"run {name} has not finished (status {status})")
    lost = lost_requests(run)
    if lost:
        issues.append(f"run {name} {lost_text(lost)}")
    if run.get("client_limited"):
        issues.append(
            f"run {name} is client-limited: the client could not keep up, so its latencies "
            "include the client's own delays"
        )
    rate = error_rate
    if rate is None:
        summary = run.get("summary") or {}
        value = summary.get("error_rate") if isinstance(summary, Mapping) else None
        rate = float(value) if isinstance(value, int | float) else None
    bound = spec_error_bound(run.get("spec"))
    if rate is not None and rate > bound and status != RunStatus.FAILED:
        issues.append(
            f"run {name} is over its error bound: {rate:.1%} of requests failed (bound {bound:.0%})"
        )
    return issues
