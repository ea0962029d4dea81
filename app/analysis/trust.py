"""Whether a run can be trusted: its status from its requests, the note saying why it failed,
and the issues that travel with it (client-limited, over its error bound, lost requests).

Pure functions; one rule for every place that decides a run's status (a local bench, a
worker's job on the server, an import):

* stopped by the user before its end (Ctrl-C, a cancel) -> ``cancelled`` (what it measured
  is kept; requests cut in flight are ``cancelled``, not errors);
* requests were sent and none succeeded -> ``failed``;
* error rate above ``max_error_rate`` -> ``partial``;
* any request lost (sent or recorded, never stored) -> ``partial``;
* otherwise ``succeeded``.

The error rate is failed / sent over the measured requests (warm-ups excluded): failed
means an error or a timeout, what the target did; a cancelled request (cut by the client:
a stop, a cancel, the run's time limit) is sent, so it counts in the denominator (SPEC §2),
but it is no error, so never in the numerator.

How a stored run reads (valid, or why not) is ``app.analysis.verdict.run_verdict``; the
trust issues below are its flagged issues.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.domain import RequestRecord, RequestStatus, RunStatus

DEFAULT_MAX_ERROR_RATE = 0.05
NS_PER_S = 1_000_000_000
# what the target did wrong (a cancelled request was cut by the client: no failure)
SERVER_FAILURES = (RequestStatus.ERROR, RequestStatus.TIMEOUT)


@dataclass(frozen=True, slots=True)
class RequestTally:
    """Measured requests: how many were sent, how many of them succeeded and how many the
    client cut (cancelled); the rest failed (error, timeout)."""

    sent: int
    ok: int
    cancelled: int = 0

    @property
    def failed(self) -> int:
        return self.sent - self.ok - self.cancelled

    @property
    def error_rate(self) -> float | None:
        return self.failed / self.sent if self.sent else None


def tally(records: Sequence[RequestRecord]) -> RequestTally:
    """Sent / ok / cancelled among the measured (non-warm-up) requests."""
    sent = [r for r in records if not r.warmup and r.sent_ns is not None]
    return RequestTally(
        len(sent),
        sum(1 for r in sent if r.status is RequestStatus.OK),
        sum(1 for r in sent if r.status is RequestStatus.CANCELLED),
    )


def over_error_bound(t: RequestTally, max_error_rate: float) -> bool:
    rate = t.error_rate
    return rate is not None and rate > max_error_rate


def run_status(
    t: RequestTally, *, stopped: bool, max_error_rate: float, lost: int = 0
) -> RunStatus:
    """The run's status from its requests (the module doc's rule; ``stopped``: by the user;
    ``lost``: requests sent or recorded that were never stored)."""
    if stopped:
        return RunStatus.CANCELLED
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
    is the run-relative time the first failure was seen (its end, else its send). Cancelled
    requests are not failures: when every request sent was cut by the client, the note says
    so ("none of the 4 requests sent completed: all were cut by the client (run hit
    max_duration_s=0.35)"). None within the bound."""
    measured = [r for r in records if not r.warmup and r.sent_ns is not None]
    t = tally(records)
    if t.sent and t.cancelled == t.sent:
        cut = Counter(r.error or "cancelled" for r in measured)
        why = sorted(cut.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
        word = "request" if t.sent == 1 else "requests"
        return f"none of the {t.sent} {word} sent completed: all were cut by the client ({why})"
    if not over_error_bound(t, max_error_rate):
        return None
    failed = [r for r in measured if r.status in SERVER_FAILURES]
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
