"""The runs API against real SQLite and PostgreSQL: create, validate, list, read, annotate,
cancel and delete."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, select

from app.storage.models import Job, Run
from tests.api_support import SPEC, Api, api_client, wire


@pytest.fixture
def api(db_url: str) -> Iterator[Api]:
    with api_client(db_url) as a:
        yield a


def _counts(api: Api) -> tuple[int, int]:
    with api.sessions() as s:
        runs = s.scalar(select(func.count()).select_from(Run)) or 0
        jobs = s.scalar(select(func.count()).select_from(Job)) or 0
    return runs, jobs


def test_create_run_queues_a_job(api: Api) -> None:
    out = api.create_run(name="first", tags=["a", "b"], requirements={"labels": {"pool": "a"}})
    job = api.client.get(f"/api/v1/jobs/{out['job_id']}").json()
    assert job["state"] == "queued" and job["kind"] == "bench"
    assert job["run_id"] == out["run_id"] and job["attempt"] == 0
    assert job["requirements"]["labels"] == {"pool": "a"}
    assert job["spec"]["num_prompts"] == SPEC["num_prompts"]
    detail = api.client.get(f"/api/v1/runs/{out['run_id']}").json()
    assert detail["run"]["status"] == "queued" and detail["run"]["name"] == "first"
    assert detail["run"]["tags"] == ["a", "b"]
    assert detail["job"]["id"] == out["job_id"]
    assert detail["report"]["metrics"]["requests"]["total"] == 0


def test_api_key_reaches_the_worker_but_is_never_listed(api: Api) -> None:
    out = api.create_run(api_key="sk-secret")
    job = api.client.get(f"/api/v1/jobs/{out['job_id']}").json()
    assert "api_key" not in job["spec"]
    assert "sk-secret" not in api.client.get(f"/api/v1/runs/{out['run_id']}").text
    wid = api.register()
    leased = api.lease(wid)
    assert leased is not None and leased["spec"]["api_key"] == "sk-secret"


def test_request_shaping_fields_reach_the_worker(api: Api) -> None:
    shaping = {
        "headers": {"X-Tenant": "lab-1"},
        "temperature": 0.3,
        "top_k": 20,
        "stream": False,
        "ramp_up_strategy": "linear",
        "ramp_up_start_rps": 1.0,
        "ramp_up_end_rps": 8.0,
    }
    out = api.create_run(**shaping)
    job = api.client.get(f"/api/v1/jobs/{out['job_id']}").json()
    assert {k: job["spec"][k] for k in shaping} == shaping
    leased = api.lease(api.register())
    assert leased is not None and leased["spec"]["headers"] == {"X-Tenant": "lab-1"}


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"input_len": 0}, "input_len"),
        ({"num_prompts": "many"}, "num_prompts"),
        ({"base_url": "ftp://x"}, "base_url"),
        ({"bogus_flag": 1}, "bogus_flag"),
        ({"endpoint": "moderations"}, "endpoint"),
        ({"goodput": {"ttft": -5}}, "goodput"),
        ({"requirements": {"min_gpu_memory_mb": -1}}, "min_gpu_memory_mb"),
        ({"request_rate": 0}, "request_rate"),
        ({"headers": {"Authorization": "Bearer x"}}, "headers"),
        ({"headers": {"X-Api-Key": "k"}}, "headers"),
        ({"top_p": 2}, "top_p"),
        ({"ramp_up_strategy": "cubic"}, "ramp_up_strategy"),
        ({"stream": "sometimes"}, "stream"),
    ],
)
def test_bad_spec_field_is_422_naming_it_and_creates_nothing(
    api: Api, override: dict[str, Any], field: str
) -> None:
    r = api.client.post("/api/v1/runs", json=SPEC | override, headers=api.h(api.run))
    assert r.status_code == 422, r.text
    locs = [e["loc"] for e in r.json()["detail"]]
    assert any(field in loc for loc in locs), locs
    assert _counts(api) == (0, 0)


def test_missing_required_field_is_named(api: Api) -> None:
    body = {k: v for k, v in SPEC.items() if k != "model"}
    r = api.client.post("/api/v1/runs", json=body, headers=api.h(api.run))
    assert r.status_code == 422
    assert ["body", "model"] in [e["loc"] for e in r.json()["detail"]]
    assert _counts(api) == (0, 0)


def test_list_filters_and_pagination(api: Api) -> None:
    a = api.create_run(model="m1", tags=["x"])["run_id"]
    b = api.create_run(model="m2", tags=["x", "y"], base_url="http://other:1/")["run_id"]
    c = api.create_run(model="m1")["run_id"]
    api.client.post(f"/api/v1/runs/{c}/cancel", headers=api.h(api.run))

    def ids(**params: Any) -> tuple[list[str], int]:
        r = api.client.get("/api/v1/runs", params=params)
        assert r.status_code == 200, r.text
        return [i["id"] for i in r.json()["items"]], r.json()["total"]

    assert ids() == ([c, b, a], 3)
    assert ids(model="m1") == ([c, a], 2)
    assert ids(tag="x") == ([b, a], 2)
    assert ids(tag="y") == ([b], 1)
    assert ids(target="http://other:1") == ([b], 1)
    assert ids(status="cancelled") == ([c], 1)
    assert ids(status="queued", model="m1") == ([a], 1)
    assert ids(limit=2) == ([c, b], 3)
    assert ids(limit=2, offset=2) == ([a], 3)
    past = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).isoformat()
    future = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    assert ids(since=past)[1] == 3
    assert ids(since=future)[1] == 0
    assert ids(until=past)[1] == 0
    assert api.client.get("/api/v1/runs", params={"limit": 501}).status_code == 422
    assert api.client.get("/api/v1/runs", params={"status": "nope"}).status_code == 422


def test_unknown_run_is_404_with_a_message(api: Api) -> None:
    for method, path in [
        ("GET", "/api/v1/runs/nope"),
        ("GET", "/api/v1/runs/nope/requests"),
        ("GET", "/api/v1/runs/nope/requests/0/events"),
        ("POST", "/api/v1/runs/nope/cancel"),
        ("DELETE", "/api/v1/runs/nope"),
    ]:
        r = api.client.request(method, path, headers=api.h(api.run))
        assert r.status_code == 404, (method, path, r.text)
        assert "nope" in r.json()["detail"]


def test_tags_and_note(api: Api) -> None:
    rid = api.create_run()["run_id"]
    r = api.client.put(
        f"/api/v1/runs/{rid}/tags", json={"tags": [" a ", "b", "a"]}, headers=api.h(api.run)
    )
    assert r.json() == {"run_id": rid, "tags": ["a", "b"]}
    r = api.client.put(f"/api/v1/runs/{rid}/tags", json={"tags": [""]}, headers=api.h(api.run))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "tags"]
    r = api.client.put(
        f"/api/v1/runs/{rid}/note", json={"note": "warm GPU"}, headers=api.h(api.run)
    )
    assert r.json()["note"] == "warm GPU"
    run = api.client.get(f"/api/v1/runs/{rid}").json()["run"]
    assert run["tags"] == ["a", "b"] and run["note"] == "warm GPU"


def test_cancel_queued_run_is_immediate(api: Api) -> None:
    out = api.create_run()
    r = api.client.post(f"/api/v1/runs/{out['run_id']}/cancel", headers=api.h(api.run))
    assert r.status_code == 200
    assert r.json() | {} == {
        "run_id": out["run_id"],
        "job_id": out["job_id"],
        "state": "cancelled",
        "cancel_requested": False,
    }
    assert api.client.get(f"/api/v1/runs/{out['run_id']}").json()["run"]["status"] == "cancelled"
    assert api.lease(api.register()) is None
    again = api.client.post(f"/api/v1/runs/{out['run_id']}/cancel", headers=api.h(api.run))
    assert again.status_code == 409


def test_delete_run_removes_its_data_and_refuses_while_running(api: Api) -> None:
    out = api.create_run()
    rid, jid = out["run_id"], out["job_id"]
    job = api.lease(api.register())
    assert job is not None
    body = {"lease_id": job["lease_id"], "batch_no": 0, "requests": wire([0, 1])}
    assert api.post_job(jid, "results", body).status_code == 200
    r = api.client.delete(f"/api/v1/runs/{rid}", headers=api.h(api.run))
    assert r.status_code == 409 and "force" in r.json()["detail"]
    r = api.client.delete(f"/api/v1/runs/{rid}", params={"force": True}, headers=api.h(api.run))
    assert r.json() == {"run_id": rid, "deleted": True}
    assert api.client.get(f"/api/v1/runs/{rid}").status_code == 404
    assert api.client.get(f"/api/v1/jobs/{jid}").status_code == 404
    assert _counts(api) == (0, 0)
    # the worker's next heartbeat learns its lease is gone
    hb = api.post_job(jid, "heartbeat", {"lease_id": job["lease_id"]})
    assert hb.status_code == 409


def test_openapi_document_lists_every_route_with_typed_responses(api: Api) -> None:
    doc = api.client.get("/openapi.json").json()
    paths = doc["paths"]
    for p in [
        "/api/v1/runs",
        "/api/v1/runs/{run_id}",
        "/api/v1/runs/{run_id}/requests",
        "/api/v1/runs/{run_id}/requests/{index}/events",
        "/api/v1/runs/{run_id}/cancel",
        "/api/v1/runs/{run_id}/tags",
        "/api/v1/runs/{run_id}/note",
        "/api/v1/jobs",
        "/api/v1/jobs/{job_id}",
        "/api/v1/jobs/{job_id}/progress/stream",
        "/api/v1/workers",
        "/api/v1/workers/register",
        "/api/v1/workers/{worker_id}/lease",
        "/api/v1/jobs/{job_id}/heartbeat",
        "/api/v1/jobs/{job_id}/results",
        "/api/v1/jobs/{job_id}/complete",
        "/api/v1/tokens",
        "/api/v1/tokens/{token_id}",
        "/healthz",
    ]:
        assert p in paths, p
    schemas = doc["components"]["schemas"]
    for name in ["RunCreate", "RunList", "RunDetail", "JobInfo", "LeaseResponse", "BatchAck"]:
        assert name in schemas
    assert "HTTPBearer" in doc["components"]["securitySchemes"]
