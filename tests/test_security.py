"""Limits and access: 413 body limits, security headers and CSP on pages, CORS closed by
default, the target allow-list, worker-token isolation, constant-time token comparison, and
names and notes shown escaped."""

from __future__ import annotations

import hmac
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, select

from app.api.app import create_app
from app.services import auth, targets
from app.settings import Settings
from app.storage.models import Job, Run
from tests.api_support import SPEC, Api, api_client, wire
from tests.live_server import make_token
from tests.web_support import post_form, sign_in

SMALL = 4096  # max_body_bytes in these tests
UPLOAD = 64 * 1024  # max_upload_bytes in these tests


@pytest.fixture
def api(sqlite_url: str) -> Iterator[Api]:
    with api_client(sqlite_url, max_body_bytes=SMALL, max_upload_bytes=UPLOAD) as a:
        yield a


def _count(api: Api, model: type[Any]) -> int:
    with api.sessions() as s:
        return int(s.scalar(select(func.count()).select_from(model)) or 0)


# ----------------------------------------------------------------------------- 413


def _assert_413(r: Any, limit: int) -> None:
    assert r.status_code == 413, r.text
    detail = r.json()["detail"][0]
    assert detail["loc"] == ["body"] and f"{limit}-byte limit" in detail["msg"]


def test_oversized_body_is_413_and_writes_nothing(api: Api) -> None:
    big = SPEC | {"name": "x" * (SMALL + 10)}
    _assert_413(api.client.post("/api/v1/runs", json=big, headers=api.h(api.run)), SMALL)
    # without Content-Length (chunked): counted while reading
    chunks = iter([json.dumps(big).encode()[i : i + 1000] for i in range(0, SMALL + 2000, 1000)])
    r = api.client.post(
        "/api/v1/runs",
        content=chunks,
        headers=api.h(api.run) | {"Content-Type": "application/json"},
    )
    _assert_413(r, SMALL)
    assert _count(api, Run) == 0
    # a chunked body within the limit still reaches the route
    small = json.dumps(SPEC).encode()
    r = api.client.post(
        "/api/v1/runs",
        content=iter([small[:10], small[10:]]),
        headers=api.h(api.run) | {"Content-Type": "application/json"},
    )
    assert r.status_code == 201, r.text
    # the launch form and the sign-in form have the same limit
    r = api.client.post(
        "/launch",
        content=b"name=" + b"x" * SMALL,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    _assert_413(r, SMALL)
    assert _count(api, Run) == 1


def test_result_batches_have_their_own_larger_limit(api: Api) -> None:
    out = api.create_run(num_prompts=400, output_len=4)
    wid = api.register()
    job = api.lease(wid)
    assert job is not None and job["job_id"] == out["job_id"]
    lease = job["lease_id"]
    body = {"lease_id": lease, "batch_no": 0, "requests": wire(list(range(40)))}
    size = len(json.dumps(body))
    assert SMALL < size < UPLOAD  # bigger than other routes allow, within the upload limit
    r = api.post_job(out["job_id"], "results", body)
    assert r.status_code == 200 and r.json()["accepted"] == 40, r.text
    huge = {"lease_id": lease, "batch_no": 1, "requests": wire(list(range(40, 400)))}
    assert len(json.dumps(huge)) > UPLOAD
    _assert_413(api.post_job(out["job_id"], "results", huge), UPLOAD)
    with api.sessions() as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 1
    r = api.client.get(f"/api/v1/runs/{out['run_id']}/requests", params={"limit": 5000})
    assert r.json()["total"] == 40  # the refused batch wrote nothing


# ------------------------------------------------------------------ headers and CORS


def test_pages_carry_security_headers_and_a_csp_without_inline_script(api: Api) -> None:
    run_id = api.create_run(name="csp")["run_id"]
    for path in ["/", f"/runs/{run_id}", "/launch", "/signin", "/workers"]:
        r = api.client.get(path)
        assert r.status_code == 200, path
        csp = r.headers["content-security-policy"]
        script_src = re.search(r"script-src ([^;]+)", csp)
        assert script_src is not None and "unsafe" not in script_src.group(1), csp
        assert "frame-ancestors 'none'" in csp and "object-src 'none'" in csp
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["referrer-policy"] == "same-origin"
        # every executable <script> loads a file: the CSP would block inline code
        for tag in re.findall(r"<script\b[^>]*>", r.text):
            assert "src=" in tag or 'type="application/json"' in tag, (path, tag)
    api_r = api.client.get("/api/v1/runs")
    assert api_r.headers["x-content-type-options"] == "nosniff"
    assert "content-security-policy" not in api_r.headers  # JSON: no CSP needed
    docs = api.client.get("/docs")  # Swagger UI from local files, under the same CSP
    assert "script-src 'self';" in docs.headers["content-security-policy"]
    assert all("src=" in tag for tag in re.findall(r"<script\b[^>]*>", docs.text))
    assert "cdn" not in docs.text.lower()


def _preflight(api: Api, origin: str) -> Any:
    return api.client.options(
        "/api/v1/runs",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
    )


def test_cors_is_closed_by_default(api: Api) -> None:
    r = _preflight(api, "https://evil.example")
    assert "access-control-allow-origin" not in r.headers
    assert r.status_code >= 400
    r = api.client.get("/api/v1/runs", headers={"Origin": "https://evil.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_cors_origins_opt_in(sqlite_url: str) -> None:
    with api_client(sqlite_url, cors_origins=["https://dash.example"]) as api:
        r = _preflight(api, "https://dash.example")
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "https://dash.example"
        r = _preflight(api, "https://evil.example")
        assert "access-control-allow-origin" not in r.headers


# ------------------------------------------------------------------------ allow-list


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://10.1.2.3:8000", True),
        ("http://[::ffff:10.1.2.3]:8000", True),  # IPv4-mapped IPv6 is the same host
        ("http://169.254.169.254/latest", False),  # cloud metadata
        ("http://127.0.0.1:9000", True),
        ("http://127.0.0.1:9001", False),  # port pinned
        ("http://localhost:9000", False),  # names are not resolved
        ("https://vllm.gpu.example", True),
        ("https://VLLM.GPU.EXAMPLE./v1", True),
        ("https://gpu.example.attacker.net", False),
        ("http://vllm.gpu.example@192.168.0.1", False),  # userinfo is not the host
        ("http://inference.lab:8000", True),
        ("http://inference.lab:8001", False),
        ("ftp://10.1.2.3", False),
        ("http://", False),
    ],
)
def test_allowlist_rules(url: str, allowed: bool) -> None:
    rules = targets.parse_rules(
        ["10.0.0.0/8", "127.0.0.1:9000", "*.gpu.example", "inference.lab:8000"]
    )
    assert targets.target_allowed(url, rules) is allowed
    assert targets.target_allowed(url, []) is True  # empty list: no restriction


def test_bad_allowlist_entry_fails_at_start() -> None:
    with pytest.raises(ValueError, match="neither a host pattern nor a CIDR"):
        create_app(Settings(database_url="sqlite://", target_allowlist=["http://x/y"]))


def test_launch_api_and_form_refuse_targets_outside_the_allowlist(sqlite_url: str) -> None:
    with api_client(sqlite_url, target_allowlist=["10.0.0.0/8", "*.gpu.example"]) as api:
        body = SPEC | {"base_url": "http://192.168.1.1"}
        r = api.client.post("/api/v1/runs", json=body, headers=api.h(api.run))
        assert r.status_code == 422
        detail = r.json()["detail"][0]
        assert detail["loc"] == ["body", "base_url"] and "allow-list" in detail["msg"]
        assert _count(api, Run) == 0 and _count(api, Job) == 0
        body = SPEC | {"base_url": "http://vllm.gpu.example:8000"}
        assert api.client.post("/api/v1/runs", json=body, headers=api.h(api.run)).status_code == 201
        # the dashboard's launch form: the message beside base_url, nothing queued
        sign_in(api.client, api.run)
        form = {"base_url": "http://192.168.1.1:8000", "model": "m", "num_prompts": "2"}
        r = post_form(api.client, "/launch", form, follow_redirects=False)
        assert r.status_code == 422 and "allow-list" in r.text
        assert _count(api, Run) == 1


# ---------------------------------------------------------------------- token handling


def test_tokens_are_compared_in_constant_time(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    with api.sessions() as s:
        assert auth.authenticate(s, api.run) is not None
        assert auth.authenticate(s, "tt_" + "A" * 40) is None  # unknown: no row to compare
    assert calls and all(len(a) == len(b) == 64 for a, b in calls)  # digests, not secrets
    assert all(api.run not in (a, b) for a, b in calls)


def test_a_worker_token_cannot_see_other_jobs_or_act_as_a_user(sqlite_url: str) -> None:
    with api_client(sqlite_url, auth_reads=True) as api:
        mine = api.create_run()
        theirs = api.create_run()
        other = make_token(sqlite_url, "worker", name="other-worker")
        wid = api.register()
        wid_other = api.register(token=other)
        job = api.lease(wid)
        job_other = api.lease(wid_other, token=other)
        assert job is not None and job_other is not None
        assert {job["job_id"], job_other["job_id"]} == {mine["job_id"], theirs["job_id"]}
        # acting on the other worker's job: refused, nothing stored
        for what, body in [
            ("heartbeat", {"lease_id": job_other["lease_id"]}),
            ("results", {"lease_id": job_other["lease_id"], "batch_no": 0, "requests": wire([0])}),
            (
                "complete",
                {"lease_id": job_other["lease_id"], "status": "succeeded", "total_batches": 0},
            ),
        ]:
            r = api.post_job(job_other["job_id"], what, body)
            assert r.status_code in (403, 409), (what, r.text)
        # its own lease id on the other job: still refused
        r = api.post_job(job_other["job_id"], "heartbeat", {"lease_id": job["lease_id"]})
        assert r.status_code in (403, 409)
        # another worker's id: cannot lease through it
        r = api.client.post(
            f"/api/v1/workers/{wid_other}/lease", json={}, headers=api.h(api.worker)
        )
        assert r.status_code == 403
        # user routes: no reading runs, jobs, tokens; no writing
        for method, path in [
            ("GET", "/api/v1/runs"),
            ("GET", f"/api/v1/runs/{theirs['run_id']}"),
            ("GET", f"/api/v1/runs/{theirs['run_id']}/requests"),
            ("GET", "/api/v1/jobs"),
            ("GET", f"/api/v1/jobs/{job_other['job_id']}"),
            ("GET", "/api/v1/tokens"),
            ("POST", "/api/v1/runs"),
            ("POST", f"/api/v1/runs/{theirs['run_id']}/cancel"),
            ("DELETE", f"/api/v1/runs/{theirs['run_id']}"),
            ("POST", "/api/v1/tokens"),
        ]:
            r = api.client.request(method, path, json={}, headers=api.h(api.worker))
            assert r.status_code == 403, (method, path, r.status_code)
        r = api.client.get(
            f"/runs/{theirs['run_id']}", headers=api.h(api.worker), follow_redirects=False
        )
        assert r.status_code in (303, 401, 403)  # bearer headers do not sign pages in
        sign_in(api.client, api.worker)
        r = api.client.get(f"/runs/{theirs['run_id']}", follow_redirects=False)
        assert r.status_code in (303, 401, 403), r.status_code
        assert _stored(api, theirs["run_id"]) == 0


def _stored(api: Api, run_id: str) -> int:
    r = api.client.get(f"/api/v1/runs/{run_id}/requests", headers=api.h(api.read))
    total: int = r.json()["total"]
    return total


# --------------------------------------------------------------------------- escaping

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def test_names_notes_and_tags_are_shown_escaped(api: Api) -> None:
    out = api.create_run(name=HOSTILE)
    run_id = out["run_id"]
    h = api.h(api.run)
    assert (
        api.client.put(f"/api/v1/runs/{run_id}/note", json={"note": HOSTILE}, headers=h).status_code
        == 200
    )
    assert (
        api.client.put(
            f"/api/v1/runs/{run_id}/tags", json={"tags": ["<b>t</b>"]}, headers=h
        ).status_code
        == 200
    )
    for path in ["/", f"/runs/{run_id}", f"/runs/{run_id}/requests", f"/launch?again={run_id}"]:
        html = api.client.get(path).text
        assert "<script>alert" not in html and "<img src=x" not in html, path
        assert "<b>t</b>" not in html, path
    run_page = api.client.get(f"/runs/{run_id}").text
    assert "&lt;script&gt;alert(" in run_page  # shown, as text
