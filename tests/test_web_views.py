"""View models: trust warnings (client-limited, error rate over the run's bound) and the
run page's status and validity cards while a run is live."""

from __future__ import annotations

from typing import Any

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


def test_error_rate_bound_from_the_spec_or_five_percent() -> None:
    assert runs_view.error_bound(None) == 0.05
    assert runs_view.error_bound({"max_error_rate": 0.2}) == 0.2
    assert runs_view.error_bound({"max_error_rate": "junk"}) == 0.05

    def warn(rate: float, spec: dict[str, Any] | None = None) -> list[str]:
        out = runs_view.trust_warnings(
            client_limited=False, notes=[], error_rate=rate, failed=None, spec=spec
        )
        return [w.short for w in out]

    assert warn(0.05) == []  # at the bound is within it
    assert warn(0.06) == ["errors 6.0% > 5%"]
    assert warn(0.06, {"max_error_rate": 0.1}) == []
    limited = runs_view.trust_warnings(
        client_limited=True,
        notes=["send lag p99 12.00 ms > 10 ms", "mixed receive stamps"],
        error_rate=0.0,
        failed=0,
        spec={},
    )
    assert [w.short for w in limited] == ["client-limited"]
    assert "send lag p99 12.00 ms > 10 ms" in limited[0].text
    assert "mixed receive stamps" not in limited[0].text


def test_live_cards_follow_the_job_and_validity_waits_for_data() -> None:
    live = runs_view.summary_cards(
        _report(status="queued", sent=0, failed=0), active=True, job_state="running"
    )
    by_id = {c.id: c for c in live if c.id}
    assert by_id["status"].value == "running"  # the job's state, as the progress bar says
    assert by_id["validity"].value == "pending"
    starting = runs_view.summary_cards(
        _report(status="queued", sent=0, failed=0), active=True, job_state="leased"
    )
    assert starting[0].value == "starting"
    cards = runs_view.summary_cards(_report(status="succeeded", sent=10, failed=0))
    done = {c.id: c for c in cards}
    assert done["status"].value == "succeeded" and done["validity"].value == "valid"
    empty = {c.id: c for c in runs_view.summary_cards(_report(status="failed", sent=0, failed=0))}
    assert empty["validity"].value == "no data"
    limited = runs_view.summary_cards(_report(status="succeeded", sent=10, failed=0, limited=True))
    assert limited[1].value == "client-limited" and limited[1].tone == "bad"
