"""A run's requests counted by outcome and the observation window its throughputs divide
by (SPEC §2): every sent request is in the error rate's denominator; the window runs from
the first send to the last request end or event unless the caller gives one."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Literal

import numpy as np

from app.domain import RequestStatus, RunTrace

from .event_views import NS_PER_S


@dataclass(frozen=True, slots=True)
class Window:
    """The observation window throughputs divide by (run-relative ns)."""

    start_ns: int
    end_ns: int
    source: Literal["explicit", "default"]

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / NS_PER_S

    def to_dict(self) -> dict[str, object]:
        rule = (
            "given by the caller"
            if self.source == "explicit"
            else "first send of any request .. last request end or event, whichever is later"
        )
        return {
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "duration_s": self.duration_s,
            "source": self.source,
            "rule": rule,
        }


def default_window(trace: RunTrace) -> Window | None:
    """First ``sent_ns`` of any sent request .. max of ``end_ns`` and every event time."""
    sent = trace.sent_ns[trace.sent_ns >= 0]
    if sent.size == 0:
        return None
    start = int(sent.min())
    ends = [int(sent.max())]
    if np.any(trace.end_ns >= 0):
        ends.append(int(trace.end_ns.max()))
    if trace.n_events:
        ends.append(int(trace.ev_t_ns.max()))
    return Window(start_ns=start, end_ns=max(ends), source="default")


@dataclass(frozen=True, slots=True)
class Counts:
    """Measured requests by outcome: ``sent = ok + failed + cancelled`` (``not_sent``: never
    sent). ``failed`` is what the target did (error, timeout); ``cancelled`` is what the
    client cut (a stop, a cancel, the run's time limit: ``RequestStatus.CANCELLED``)."""

    total: int
    sent: int
    not_sent: int
    ok: int
    failed: int
    failed_by_status: dict[str, int]
    error_rate: float | None
    error_reasons: list[tuple[str, int]]
    cancelled: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "total": self.total,
            "sent": self.sent,
            "not_sent": self.not_sent,
            "completed_ok": self.ok,
            "failed": self.failed,
            "cancelled": self.cancelled,
            "failed_by_status": dict(self.failed_by_status),
            "error_rate": self.error_rate,
            "error_reasons": [{"reason": r, "count": c} for r, c in self.error_reasons],
        }


def count_requests(trace: RunTrace) -> Counts:
    """Requests sent / ok / failed / cancelled. Error rate = failed / sent (SPEC §2: every
    sent request, cancelled ones too, is in the denominator; a cancelled request is cut by
    the client, not an error of the target, so it is not in the numerator)."""
    sent_mask = trace.sent_ns >= 0
    ok_mask = trace.ok & sent_mask
    cut = np.array([s is RequestStatus.CANCELLED for s in trace.status], np.bool_)
    failed_idx = np.flatnonzero(sent_mask & ~trace.ok & ~cut)
    by_status: Counter[str] = Counter(str(trace.status[i]) for i in failed_idx)
    reasons: Counter[str] = Counter(
        trace.errors[i] or f"{trace.status[i]} (no message)" for i in failed_idx
    )
    sent = int(sent_mask.sum())
    failed = int(failed_idx.shape[0])
    return Counts(
        total=trace.n_requests,
        sent=sent,
        not_sent=trace.n_requests - sent,
        ok=int(ok_mask.sum()),
        failed=failed,
        failed_by_status=dict(sorted(by_status.items())),
        error_rate=failed / sent if sent else None,
        error_reasons=sorted(reasons.items(), key=lambda rc: (-rc[1], rc[0])),
        cancelled=int((sent_mask & cut).sum()),
    )


def rate(amount: float, window: Window | None) -> float | None:
    if window is None or window.end_ns <= window.start_ns:
        return None
    return amount / window.duration_s


def resolve_window(trace: RunTrace, window_ns: tuple[int, int] | None) -> Window | None:
    if window_ns is None:
        return default_window(trace)
    start, end = int(window_ns[0]), int(window_ns[1])
    if end < start:
        raise ValueError(f"window end {end} is before its start {start}")
    return Window(start_ns=start, end_ns=end, source="explicit")
