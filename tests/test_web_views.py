"""View models: trust warnings (client-limited, error rate over the run's bound) and the
run page's status and validity cards while a run is live."""

from __future__ import annotations

from typing import Any

from app.analysis import verdict
from app.web import runs_view


def _report(*, status: str, sent: int, failed: int, limited: bool = False) -> dict[str, Any]:
    return {
        "status": status,
        "source": "bench",
        "spec": {},
        "validity": {"client_limited": limited, "notes": [], "summary_only": False},
        "metrics": {
            "requests": {"sent": sent, "failed": failed, "completed_ok": sent - failed},
            "error_rate": failed / sent if sent else None,
            "window": {},
            "slos_ms": {},
        },
    }


def _verdict(report: dict[str, Any]) -> verdict.Verdict:
    run = {"id": "r", "status": report["status"], "spec": report["spec"],
           "client_limited": report["validity"]["client_limited"]}  # fmt: skip
    return verdict.verdict_of(run, report["metrics"]["requests"])


def test_error_rate_bound_from_the_spec_or_five_percent() -> None:
    assert runs_view.error_bound(None) == 0.05
    assert runs_view.error_bound({"max_error_rate": 0.2}) == 0.2
    assert runs_view.error_bound({"max_error_rate": "junk"}) == 0.05

    def warn(rate: float, spec: dict[str, Any] | None = None) -> list[str]:
        run = {"id": "r", "status": "succeeded", "spec": spec or {}}
        requests = {"sent": 100, "completed_ok": 100 - round(rate * 100),
                    "failed": round(rate * 100), "error_rate": rate}  # fmt: skip
        return [w.short for w in verdict.verdict_of(run, requests).flagged]

    assert warn(0.05) == []  # at the bound is within it
    assert warn(0.06) == ["errors 6.0% > 5%"]
    assert warn(0.06, {"max_error_rate": 0.1}) == []
    limited = verdict.verdict_of(
        {"id": "r", "status": "succeeded", "client_limited": True, "spec": {},
         "validity": ["send lag p99 12.00 ms > 10 ms", "mixed receive stamps"]},
        {"sent": 10, "completed_ok": 10, "failed": 0, "error_rate": 0.0},
    ).flagged  # fmt: skip
    assert [w.short for w in limited] == ["client-limited"]
    assert "send lag p99 12.00 ms > 10 ms" in limited[0].text
    assert "mixed receive stamps" not in limited[0].text


def test_live_cards_follow_the_job_and_validity_waits_for_data() -> None:
    def cards(report: dict[str, Any], **kw: Any) -> list[runs_view.Card]:
        return runs_view.summary_cards(report, _verdict(report), **kw)

    queued = _report(status="queued", sent=0, failed=0)
    live = cards(queued, active=True, job_state="running")
    by_id = {c.id: c for c in live if c.id}
    assert by_id["status"].value == "running"  # the job's state, as the progress bar says
    assert by_id["validity"].value == "pending"
    assert by_id["throughput"].detail == "no data yet"  # not "0 ok over 0.00 s"
    starting = cards(queued, active=True, job_state="leased")
    assert starting[0].value == "starting"
    done = {c.id: c for c in cards(_report(status="succeeded", sent=10, failed=0))}
    assert done["status"].value == "succeeded" and done["validity"].value == "valid"
    empty = {c.id: c for c in cards(_report(status="succeeded", sent=0, failed=0))}
    assert empty["validity"].value == "no data" and empty["throughput"].detail == "no data"
    failed = {c.id: c for c in cards(_report(status="failed", sent=4, failed=4))}
    assert (failed["validity"].value, failed["validity"].tone) == ("failed", "bad")
    limited = cards(_report(status="succeeded", sent=10, failed=0, limited=True))
    assert limited[1].value == "client-limited" and limited[1].tone == "bad"
