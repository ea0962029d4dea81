"""A run's verdict: one word for whether its figures can be taken as they stand, and every
issue behind it (pure).

Every surface that says how a run reads derives it from ``run_verdict`` (the runs list's
validity column, the run page's validity card and banners, the compare and sweep pages'
flags, ``tokentrace runs`` / ``report``, the API's ``verdict``, the trust issues compare
refuses and sweeps skip), so a word and a banner can never disagree.

The issues, in the order that decides the word (the first one found names the verdict):

================  ===========================================================  ========
word              when                                                          severity
================  ===========================================================  ========
pending           queued or running: nothing else is decided before the end     warn
failed            status ``failed``, or requests were sent and none succeeded   bad
                  (a cancelled run excepted)
incomplete        requests lost: sent (or recorded) but never stored            bad
over error bound  error rate (failed / sent; cancelled requests are no errors)  bad
                  above the run's ``max_error_rate``
client-limited    the load generator fell behind its own schedule              bad
lost turns        multi-turn: planned turns never sent because their session    bad
                  ended at a failed turn (the run was not stopped)
partial           status ``partial`` with none of the above (its notes say why) bad
cancelled         stopped by the user: what completed is kept, the plan is not  warn
no data           nothing was sent                                              bad
summary-only      an import without per-token times (no ITL)                    info
valid             none of the above
================  ===========================================================  ========

``tone``: "bad" when any issue is bad, else "warn" when any is a warning, else "good"
("" while pending). A run is *valid* when its word is "valid" or "summary-only". Its
*flagged* issues (bad and warn) are the trust issues: compare refuses such a run without
``--allow-invalid``, a sweep never picks it as its max-goodput step, pages mark it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from app.analysis.trust import DEFAULT_MAX_ERROR_RATE, lost_requests, lost_text, spec_error_bound
from app.domain import RunStatus

Severity = Literal["bad", "warn", "info"]
Tone = Literal["good", "bad", "warn", ""]

PENDING = "pending"
FAILED = "failed"
INCOMPLETE = "incomplete"
OVER_ERROR_BOUND = "over error bound"
CLIENT_LIMITED = "client-limited"
LOST_TURNS = "lost turns"
PARTIAL = "partial"
CANCELLED = "cancelled"
NO_DATA = "no data"
SUMMARY_ONLY = "summary-only"
VALID = "valid"
WORDS = (
    PENDING, FAILED, INCOMPLETE, OVER_ERROR_BOUND, CLIENT_LIMITED, LOST_TURNS, PARTIAL,
    CANCELLED, NO_DATA, SUMMARY_ONLY, VALID,
)  # fmt: skip
ACTIVE = (RunStatus.QUEUED.value, RunStatus.RUNNING.value)


@dataclass(frozen=True, slots=True)
class Issue:
    """One reason a run's figures are not to be taken as they stand.

    ``word``: the verdict it gives when it is the first; ``short``: a table cell ("lost 20",
    "errors 10.0% > 5%"); ``text``: the sentence a banner shows; ``predicate``: the same
    after "run <id> " (the trust issues compare and sweeps report)."""

    word: str
    severity: Severity
    short: str
    text: str
    predicate: str

    def to_dict(self) -> dict[str, str]:
        return {
            "word": self.word,
            "severity": self.severity,
            "short": self.short,
            "text": self.text,
        }


@dataclass(frozen=True, slots=True)
class Verdict:
    word: str
    tone: Tone
    detail: str  # one line under the word (a card's detail)
    issues: tuple[Issue, ...]

    @property
    def valid(self) -> bool:
        return self.word in (VALID, SUMMARY_ONLY)

    @property
    def pending(self) -> bool:
        return self.word == PENDING

    @property
    def flagged(self) -> tuple[Issue, ...]:
        """The issues that make the run untrusted in a comparison or a gate."""
        return tuple(i for i in self.issues if i.severity != "info")

    @property
    def untrusted(self) -> tuple[Issue, ...]:
        """The issues under which the figures must not be taken at face value."""
        return tuple(i for i in self.issues if i.severity == "bad")

    @property
    def notices(self) -> tuple[Issue, ...]:
        """Warnings that are not about the figures' truth (cancelled, not finished)."""
        return tuple(i for i in self.issues if i.severity == "warn")

    def to_dict(self) -> dict[str, Any]:
        return {
            "word": self.word,
            "tone": self.tone,
            "detail": self.detail,
            "valid": self.valid,
            "issues": [i.to_dict() for i in self.issues],
        }


@dataclass(frozen=True, slots=True)
class RunFacts:
    """What the verdict reads of a run. Counts are of measured requests (None: unknown):
    ``failed`` errors and timeouts, ``cancelled`` cut by the client; ``planned`` the measured
    requests the run planned; ``lost_turns`` turns planned, never sent, the run not stopped."""

    name: str
    status: str
    sent: int | None = None
    ok: int | None = None
    failed: int | None = None
    cancelled: int | None = None
    error_rate: float | None = None
    bound: float = DEFAULT_MAX_ERROR_RATE
    lost: int = 0
    client_limited: bool = False
    client_limited_why: tuple[str, ...] = ()
    summary_only: bool = False
    planned: int | None = None
    lost_turns: int = 0


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _float(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def facts_of(
    run: Mapping[str, Any],
    requests: Mapping[str, Any] | None = None,
    *,
    error_rate: float | None = None,
) -> RunFacts:
    """``RunFacts`` of a stored run as ``app.services.runs.run_dict`` gives it (``status``,
    ``client_limited``, ``lost_requests``, ``spec``, ``validity``, ``load_stats``,
    ``summary_only``), its counts from ``requests`` (a report's ``metrics.requests``) or
    else its cached ``summary`` headline; ``error_rate`` overrides either's."""
    counts: Mapping[str, Any] = requests if requests is not None else {}
    if requests is None:
        summary = run.get("summary")
        counts = summary if isinstance(summary, Mapping) else {}
    ok = _int(counts.get("completed_ok", counts.get("completed")))
    failed = _int(counts.get("failed"))
    cancelled = _int(counts.get("cancelled"))
    sent = _int(counts.get("sent"))
    if sent is None and ok is not None and failed is not None:
        sent = ok + failed + (cancelled or 0)  # a headline cached before it held "sent"
    rate = error_rate if error_rate is not None else _float(counts.get("error_rate"))
    spec = run.get("spec") if isinstance(run.get("spec"), Mapping) else {}
    load = run.get("load_stats") if isinstance(run.get("load_stats"), Mapping) else {}
    assert isinstance(spec, Mapping) and isinstance(load, Mapping)
    notes = [str(n) for n in run.get("validity") or [] if isinstance(n, str)]
    status = str(getattr(run.get("status"), "value", run.get("status")) or "")
    load_counts = load.get("counts") if isinstance(load.get("counts"), Mapping) else {}
    assert isinstance(load_counts, Mapping)
    planned = _int(load_counts.get("planned"))
    if planned is None and not spec.get("multi_turn"):
        planned = _int(spec.get("num_prompts"))
    lost_turns = 0
    multi = bool(spec.get("multi_turn")) or isinstance(load.get("turns"), list)
    load_sent = _int(load_counts.get("sent"))
    if multi and load.get("stopped") is None and planned is not None and load_sent is not None:
        lost_turns = max(0, planned - load_sent)
    return RunFacts(
        name=str(run.get("id") or run.get("name") or "the run"),
        status=status,
        sent=sent,
        ok=ok,
        failed=failed,
        cancelled=cancelled,
        error_rate=rate,
        bound=spec_error_bound(spec),
        lost=lost_requests(run),
        client_limited=bool(run.get("client_limited")),
        client_limited_why=tuple(n for n in notes if " > " in n),
        summary_only=bool(run.get("summary_only")),
        planned=planned,
        lost_turns=lost_turns,
    )


def _counts_text(f: RunFacts) -> str:
    """ " (3 failed, 2 cancelled of 5 sent)" where the counts are known."""
    if f.sent is None or f.failed is None:
        return ""
    cut = f", {f.cancelled} cancelled" if f.cancelled else ""
    return f" ({f.failed} failed{cut} of {f.sent} sent)"


def _cancelled(f: RunFacts) -> Issue:
    if f.sent == 0:
        what = "cancelled before any request was sent"
        return Issue(CANCELLED, "warn", "cancelled", what, f"was {what}")
    of = f" of {f.planned} planned" if f.planned is not None else ""
    done = f"{f.ok if f.ok is not None else 'some'}{of} requests completed"
    cut = (
        f"; {f.cancelled} in flight were cut (cancelled: not errors, not in the latencies)"
        if f.cancelled
        else ""
    )
    return Issue(
        CANCELLED,
        "warn",
        "cancelled",
        f"cancelled by the user: {done}{cut}; the figures cover only those",
        f"was cancelled: {done}{cut}",
    )


def run_verdict(f: RunFacts) -> Verdict:
    """The verdict of a run (the module doc's table)."""
    if f.status in ACTIVE:
        issue = Issue(
            PENDING,
            "warn",
            "not finished",
            f"not finished (status {f.status}): the figures cover the requests stored so far",
            f"has not finished (status {f.status})",
        )
        return Verdict(PENDING, "", "decided when the run ends", (issue,))
    issues: list[Issue] = []
    cancelled = f.status == RunStatus.CANCELLED.value
    none_ok = bool(f.sent) and f.ok == 0 and not cancelled
    if f.status == RunStatus.FAILED.value or none_ok:
        what = "failed: no measured request succeeded" + _counts_text(f)
        issues.append(Issue(FAILED, "bad", "failed", what, what))
    if f.lost:
        lost = lost_text(f.lost)
        issues.append(Issue(INCOMPLETE, "bad", f"lost {f.lost}", lost, lost))
    rate = f.error_rate
    if rate is not None and rate > f.bound and not any(i.word == FAILED for i in issues):
        count = f"{f.failed} failed of {f.sent} sent; " if f.failed is not None else ""
        issues.append(
            Issue(
                OVER_ERROR_BOUND,
                "bad",
                f"errors {rate:.1%} > {f.bound:.0%}",
                f"error rate {rate:.1%} ({count}bound {f.bound:.0%}): the latencies describe "
                "only the requests that succeeded",
                f"is over its error bound: {rate:.1%} of requests failed (bound {f.bound:.0%})",
            )
        )
    if f.client_limited:
        why = f" ({'; '.join(f.client_limited_why)})" if f.client_limited_why else ""
        issues.append(
            Issue(
                CLIENT_LIMITED,
                "bad",
                "client-limited",
                "client-limited: the load generator fell behind its own schedule, so the "
                "latencies may be inflated" + why,
                "is client-limited: the client could not keep up, so its latencies include "
                "the client's own delays",
            )
        )
    if f.lost_turns and not cancelled:
        of = f" of {f.planned} planned" if f.planned is not None else ""
        what = (
            f"{f.lost_turns}{of} turns were never sent: their sessions ended at a failed "
            "turn, so later turns' figures cover only the sessions that got that far"
        )
        what = f"lost turns: {what}"
        issues.append(Issue(LOST_TURNS, "bad", f"lost {f.lost_turns} turns", what, what))
    if f.status == RunStatus.PARTIAL.value and not issues:
        what = "ended partial: it stopped before its plan (its notes say why)"
        issues.append(Issue(PARTIAL, "bad", "partial", what, what))
    if cancelled:
        issues.append(_cancelled(f))
    if f.sent == 0 and not f.summary_only and not cancelled:
        issues.append(
            Issue(NO_DATA, "bad", "no data", "no data: no request was sent", "sent no request")
        )
    if f.summary_only:
        what = "summary-only (imported): the file has no per-token times, so no ITL"
        issues.append(Issue(SUMMARY_ONLY, "info", "summary-only", what, what))
    if not issues:
        return Verdict(VALID, "good", "the client kept its schedule", ())
    tone: Tone = "good"
    if any(i.severity == "bad" for i in issues):
        tone = "bad"
    elif any(i.severity == "warn" for i in issues):
        tone = "warn"
    return Verdict(issues[0].word, tone, issues[0].text, tuple(issues))


def verdict_of(
    run: Mapping[str, Any],
    requests: Mapping[str, Any] | None = None,
    *,
    error_rate: float | None = None,
) -> Verdict:
    """``run_verdict(facts_of(...))``: the verdict of a stored run (see ``facts_of``)."""
    return run_verdict(facts_of(run, requests, error_rate=error_rate))


def run_trust_issues(run: Mapping[str, Any], error_rate: float | None = None) -> list[str]:
    """Why a stored run's figures cannot be trusted as they stand (empty: nothing known):
    its verdict's flagged issues, each as "run <id> <predicate>". Used by ``compare`` (which
    refuses such runs), by sweeps (which never pick such a step as max goodput) and by the
    pages."""
    f = facts_of(run, error_rate=error_rate)
    return [f"run {f.name} {i.predicate}" for i in run_verdict(f).flagged]
