"""Series alerts: the webhook goes through a run target's checks; thresholds and change
points raised once each and delivered to a real loopback listener (JSON with a
Slack-compatible ``text``); a failing webhook retried with back-off, its failures kept and
shown; settling a run sends nothing (delivery is the alert loop's, never a finalize's); the
dashboard's own loop delivers."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.fernet import Fernet

from app.services import series_alerts
from app.services.secretbox import SecretBox
from app.settings import Settings
from app.storage.db import session_scope
from app.storage.models import utcnow
from tests.api_support import Api, api_client
from tests.series_support import import_run, p99, shifted
from tests.target_listener import Listener

S = "/api/v1/series"
KEY = Fernet.generate_key().decode()


def _client(db_url: str, **kw: Any) -> Any:
    # the loop off (an hour between passes): these tests run each pass themselves
    return api_client(
        db_url, secret_key=KEY, alert_retry_s=30.0, alert_max_attempts=3, alert_poll_s=3600, **kw
    )


def _box() -> SecretBox:
    return SecretBox(KEY.encode())


def _settings(db_url: str, **kw: Any) -> Settings:
    base: dict[str, Any] = {"database_url": db_url, "secret_key": KEY, "alert_retry_s": 30.0,
                            "alert_max_attempts": 3}  # fmt: skip
    return Settings(**(base | kw))


def _join(api: Api, name: str, run_id: str) -> dict[str, Any]:
    r = api.client.post(f"{S}/{name}/runs", json={"run_id": run_id}, headers=api.h(api.run))
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _rule(api: Api, name: str, **body: Any) -> Any:
    return api.client.post(f"{S}/{name}/alerts", json=body, headers=api.h(api.run))


def test_webhook_goes_through_the_target_checks(sqlite_url: str, tmp_path: Path) -> None:
    with _client(sqlite_url) as api, Listener() as hook:
        _join(api, "w", import_run(api.sessions, tmp_path, [10.0, 12.0], name="r"))
        refused = {
            "http://169.254.169.254/latest": "link-local",
            "http://[fe80::1]:80/x": "link-local",
            "http://127.0.0.1:8000/hook": "this dashboard itself",
            "http://localhost:8000/hook": "this dashboard itself",
            "ftp://example.com/x": "http://",
            "http://user:secret@127.0.0.1:9/x": "credentials",
            "http://exa mple.com/": "U+0020",
        }
        for url, why in refused.items():
            r = _rule(api, "w", webhook=url, max_value=1)
            assert r.status_code == 422, (url, r.text)
            err = r.json()["detail"][0]
            assert err["loc"] == ["body", "webhook"] and why in err["msg"], (url, err)
        ok = _rule(api, "w", webhook=hook.url + "/T000/B000/secretpart", max_value=1)
        assert ok.status_code == 201, ok.text
        assert ok.json()["webhook"] == f"http://127.0.0.1:{hook.port}/…"  # no secret shown
        r = _rule(api, "w", webhook=hook.url, metric="ttft:p42")
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "metric"]
        r = _rule(api, "w", webhook=hook.url, change_points=False)
        assert r.status_code == 422 and "threshold" in r.json()["detail"][0]["msg"]
        assert len(api.client.get(f"{S}/w/alerts").json()["alerts"]) == 1  # refusals: none kept
    with _client(sqlite_url, target_allowlist=["10.0.0.0/8"]) as api, Listener() as hook:
        r = _rule(api, "w", webhook=hook.url, max_value=1)
        assert r.status_code == 422 and "allow-list" in r.json()["detail"][0]["msg"]


def test_threshold_alert_delivered_once(db_url: str, tmp_path: Path) -> None:
    with _client(db_url) as api, Listener() as hook:
        for i in range(3):
            _join(api, "thr", import_run(api.sessions, tmp_path, [100.0] * 5, name=f"a{i}"))
        assert _rule(api, "thr", metric="ttft:p99", webhook=hook.url + "/hook", max_value=120,
                     change_points=False).status_code == 201  # fmt: skip
        fine = import_run(api.sessions, tmp_path, [110.0] * 5, name="fine")
        slow_ttfts = [150.0, 151.0, 152.0, 153.0, 154.0]
        slow = import_run(api.sessions, tmp_path, slow_ttfts, name="slow")
        _join(api, "thr", fine)
        assert _join(api, "thr", slow)["state"] == "member"
        assert hook.posted() == []  # settling a run sends nothing
        settings = _settings(db_url)
        series_alerts.process(api.sessions, settings, _box())
        (body,) = hook.posted()
        got = json.loads(body)
        assert got["kind"] == "threshold" and got["run_id"] == slow and got["series"] == "thr"
        assert got["details"]["value"] == pytest.approx(p99(slow_ttfts), abs=1e-3)
        assert "series thr" in got["text"] and slow in got["text"]
        assert "past the limit 120" in got["text"]
        series_alerts.process(api.sessions, settings, _box())
        assert len(hook.posted()) == 1  # raised once
        events = api.client.get(f"{S}/thr").json()["events"]
        assert [(e["kind"], e["state"], e["attempts"], e["run_id"]) for e in events] == [
            ("threshold", "delivered", 1, slow)
        ]


def test_relative_threshold_against_the_baseline(sqlite_url: str, tmp_path: Path) -> None:
    with _client(sqlite_url) as api, Listener() as hook:
        first = import_run(api.sessions, tmp_path, [100.0] * 4, name="base")
        _join(api, "rel", first)
        _rule(api, "rel", metric="ttft:p50", webhook=hook.url, max_relative_pct=20,
              change_points=False)  # fmt: skip
        for name, ttft in (("plus10", 110.0), ("plus30", 130.0)):
            _join(api, "rel", import_run(api.sessions, tmp_path, [ttft] * 4, name=name))
        series_alerts.process(api.sessions, _settings(sqlite_url), _box())
        (body,) = hook.posted()
        text = json.loads(body)["text"]
        assert "+30.0% from the series' baseline 100" in text and "plus30" in text


def test_change_point_alert(sqlite_url: str, tmp_path: Path) -> None:
    with _client(sqlite_url) as api, Listener() as hook:
        ttfts = shifted(14, 8, seed=2)
        ids = [import_run(api.sessions, tmp_path, t, name=f"c{i}") for i, t in enumerate(ttfts)]
        _join(api, "cp", ids[0])
        assert _rule(api, "cp", metric="ttft:p99", webhook=hook.url).status_code == 201
        for rid in ids[1:]:
            _join(api, "cp", rid)
            series_alerts.process(api.sessions, _settings(sqlite_url), _box())
        kinds = [json.loads(b)["kind"] for b in hook.posted()]
        assert kinds == ["change_point"]
        got = json.loads(hook.posted()[0])
        assert got["run_id"] == ids[8] and got["details"]["kind"] == "regression"
        assert "change point in TTFT p99" in got["text"] and "regression" in got["text"]


def test_failing_webhook_retried_with_backoff(sqlite_url: str, tmp_path: Path) -> None:
    with _client(sqlite_url) as api, Listener(fail_first=2) as hook:
        _join(api, "f", import_run(api.sessions, tmp_path, [100.0] * 3, name="x"))
        _rule(api, "f", webhook=hook.url, max_value=50, change_points=False)
        _join(api, "f", import_run(api.sessions, tmp_path, [90.0] * 3, name="y"))
        settings, box = _settings(sqlite_url), _box()
        t0 = utcnow()
        series_alerts.process(api.sessions, settings, box)
        (ev,) = api.client.get(f"{S}/f").json()["events"]
        assert (ev["state"], ev["attempts"], ev["last_error"]) == ("pending", 1, "HTTP 500")
        first_retry = dt.datetime.fromisoformat(ev["next_attempt_at"])
        assert 29 <= (first_retry - t0).total_seconds() <= 40  # alert_retry_s = 30
        assert series_alerts.deliver_due(api.sessions, settings, box) == []  # not due yet
        later = series_alerts.deliver_due(api.sessions, settings, box, now=first_retry)
        assert [(d.state, d.attempts, d.error) for d in later] == [("pending", 2, "HTTP 500")]
        (ev,) = api.client.get(f"{S}/f").json()["events"]
        second = dt.datetime.fromisoformat(ev["next_attempt_at"])
        assert 59 <= (second - utcnow()).total_seconds() <= 61  # doubled: 60 s
        done = series_alerts.deliver_due(api.sessions, settings, box, now=second)
        assert [(d.state, d.attempts) for d in done] == [("delivered", 3)]
        assert len(hook.posted()) == 3
        assert json.loads(hook.posted()[0]) == json.loads(hook.posted()[2])  # the same alert


def test_a_webhook_that_keeps_failing_is_recorded_and_shown(
    sqlite_url: str, tmp_path: Path
) -> None:
    with _client(sqlite_url) as api, Listener(fail_first=99, fail_status=503) as hook:
        _join(api, "bad", import_run(api.sessions, tmp_path, [100.0] * 3, name="x"))
        _rule(api, "bad", webhook=hook.url, max_value=50, change_points=False)
        _join(api, "bad", import_run(api.sessions, tmp_path, [90.0] * 3, name="y"))
        settings, box = _settings(sqlite_url), _box()
        series_alerts.process(api.sessions, settings, box)
        far = utcnow() + dt.timedelta(days=1)
        for _ in range(3):
            series_alerts.deliver_due(api.sessions, settings, box, now=far)
        (ev,) = api.client.get(f"{S}/bad").json()["events"]
        assert (ev["state"], ev["attempts"], ev["last_error"]) == ("failed", 3, "HTTP 503")
        assert len(hook.posted()) == 3  # alert_max_attempts
        (item,) = api.client.get(S).json()["items"]
        assert item["failed_deliveries"] == 1
        page = api.client.get("/series/bad")
        assert page.status_code == 200 and 'data-state="failed"' in page.text
        assert "HTTP 503" in page.text


def test_unreachable_webhook_error_is_kept(sqlite_url: str, tmp_path: Path) -> None:
    with _client(sqlite_url) as api:
        with Listener() as gone:
            url = gone.url  # closed below: nothing listens there any more
        _join(api, "u", import_run(api.sessions, tmp_path, [100.0] * 3, name="x"))
        _rule(api, "u", webhook=url, max_value=50, change_points=False)
        _join(api, "u", import_run(api.sessions, tmp_path, [90.0] * 3, name="y"))
        series_alerts.process(api.sessions, _settings(sqlite_url), _box())
        (ev,) = api.client.get(f"{S}/u").json()["events"]
        assert ev["state"] == "pending" and ev["last_error"].startswith("ConnectError")


def test_the_dashboard_loop_delivers(live_server: Any, sqlite_url: str, tmp_path: Path) -> None:
    srv = live_server(
        sqlite_url, env={"TOKENTRACE_ALERT_POLL_S": "0.2", "TOKENTRACE_SECRET_KEY": KEY}
    )
    token = srv.create_token("run")
    h = {"Authorization": f"Bearer {token}"}
    from app.services.runs import open_database

    sessions = open_database(sqlite_url)
    with Listener() as hook:
        first = import_run(sessions, tmp_path, [100.0] * 3, name="x")
        r = httpx.post(f"{srv.url}{S}/loop/runs", json={"run_id": first}, headers=h)
        assert r.status_code == 200, r.text
        rule = {"webhook": hook.url, "max_value": 50, "change_points": False}
        r = httpx.post(f"{srv.url}{S}/loop/alerts", headers=h, json=rule)
        assert r.status_code == 201, r.text
        second = import_run(sessions, tmp_path, [90.0] * 3, name="y")
        r = httpx.post(f"{srv.url}{S}/loop/runs", json={"run_id": second}, headers=h)
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 30
        while not hook.posted() and time.monotonic() < deadline:
            time.sleep(0.1)
        (body,) = hook.posted()
        assert json.loads(body)["run_id"] == second
    with session_scope(sessions) as s:  # the server stored the delivery
        from app.storage import series as series_repo

        row = series_repo.find_series(s, "loop")
        assert row is not None
        (ev,) = series_repo.events(s, row.id)
        assert ev.state == "delivered"
