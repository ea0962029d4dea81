"""Auth: every write needs a token with the right scope; tokens are stored hashed; reads
are open unless ``auth_reads``; the token CLI."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from fastapi.routing import APIRoute
from sqlalchemy import MetaData, select

from app.cli.main import main
from tests.api_support import Api, api_client


@pytest.fixture
def api(db_url: str) -> Iterator[Api]:
    with api_client(db_url) as a:
        yield a


def _api_routes(routes: Sequence[Any]) -> Iterator[APIRoute]:
    """Every APIRoute, also inside included routers (newer FastAPI keeps those nested)."""
    for r in routes:
        if isinstance(r, APIRoute):
            yield r
        elif (sub := getattr(r, "original_router", None)) is not None:
            yield from _api_routes(sub.routes)


def _routes(api: Api) -> list[tuple[str, str]]:
    out = []
    for r in _api_routes(api.app.routes):
        if r.path.startswith("/api/"):
            path = re.sub(r"\{[^}]+\}", "x", r.path.replace("{index}", "0"))
            out.extend((m, path) for m in sorted(r.methods) if m != "HEAD")
    assert len(out) >= 20
    return out


def test_every_write_needs_a_token_and_the_right_scope(api: Api) -> None:
    writes = [(m, p) for m, p in _routes(api) if m != "GET"]
    assert len(writes) >= 12
    for method, path in writes:
        r = api.client.request(method, path, json={})
        assert r.status_code == 401, (method, path, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
        assert "token" in r.json()["detail"]
        r = api.client.request(method, path, json={}, headers=api.h("tt_not-a-real-token"))
        assert r.status_code == 401, (method, path)
        r = api.client.request(method, path, json={}, headers=api.h(api.read))
        assert r.status_code == 403, (method, path, r.text)
        assert "scope" in r.json()["detail"]


def test_scope_classes(api: Api) -> None:
    run_routes = [(m, p) for m, p in _routes(api) if m != "GET" and p.startswith("/api/v1/runs")]
    worker_routes = [
        (m, p)
        for m, p in _routes(api)
        if m == "POST" and re.match(r"^/api/v1/(workers/|jobs/x/(heartbeat|results|complete))", p)
    ]
    assert len(worker_routes) == 5
    for method, path in run_routes:  # a worker token cannot touch runs
        r = api.client.request(method, path, json={}, headers=api.h(api.worker))
        assert r.status_code == 403, (method, path)
        assert "'run' scope" in r.json()["detail"]
    for method, path in worker_routes:  # nor can a run token act as a worker
        r = api.client.request(method, path, json={}, headers=api.h(api.run))
        assert r.status_code == 403, (method, path)
        assert "'worker' scope" in r.json()["detail"]
    for method, path in [("POST", "/api/v1/tokens"), ("GET", "/api/v1/tokens")]:
        r = api.client.request(method, path, json={"scopes": ["read"]}, headers=api.h(api.run))
        assert r.status_code == 403
    # with the right scope the request gets past auth (then 404/422 for the fake ids)
    r = api.client.post("/api/v1/runs/x/cancel", headers=api.h(api.run))
    assert r.status_code == 404
    r = api.client.post("/api/v1/runs/x/cancel", headers=api.h(api.admin))  # admin implies run
    assert r.status_code == 404


def test_reads_are_open_by_default(api: Api) -> None:
    for method, path in _routes(api):
        if method == "GET" and not path.startswith("/api/v1/tokens"):
            r = api.client.get(path)  # open: answered, not 401 (422: a required query)
            assert r.status_code in (200, 404, 422), (path, r.status_code)
    assert api.client.get("/api/v1/tokens").status_code == 401


def test_reads_can_be_protected(db_url: str) -> None:
    with api_client(db_url, auth_reads=True) as api:
        for path in ["/api/v1/runs", "/api/v1/jobs", "/api/v1/workers", "/api/v1/runs/x"]:
            assert api.client.get(path).status_code == 401
            assert api.client.get(path, headers=api.h(api.worker)).status_code == 403
            assert api.client.get(path, headers=api.h(api.read)).status_code in (200, 404)
            assert api.client.get(path, headers=api.h(api.run)).status_code in (200, 404)
        assert api.client.get("/healthz").status_code == 200


def test_tokens_are_stored_hashed(api: Api) -> None:
    r = api.client.post(
        "/api/v1/tokens", json={"scopes": ["run"], "name": "ci"}, headers=api.h(api.admin)
    )
    assert r.status_code == 201
    created = r.json()
    secret = created["secret"]
    assert secret.startswith("tt_") and created["prefix"] == secret[:10]
    # the secret appears nowhere in the database
    meta = MetaData()
    with api.sessions() as s:
        meta.reflect(bind=s.get_bind())
        for table in meta.sorted_tables:
            for row in s.execute(select(table)):
                for value in row:
                    assert secret not in str(value), table.name
                    for known in (api.admin, api.run, api.read, api.worker):
                        assert known not in str(value), table.name
    # but it works, and only for its scope
    assert api.client.post("/api/v1/runs/x/cancel", headers=api.h(secret)).status_code == 404
    assert api.client.get("/api/v1/tokens", headers=api.h(secret)).status_code == 403
    listed = api.client.get("/api/v1/tokens", headers=api.h(api.admin)).json()
    assert created["id"] in [t["id"] for t in listed]
    assert all("secret" not in t for t in listed)
    # revoked: refused at once
    r = api.client.delete(f"/api/v1/tokens/{created['id']}", headers=api.h(api.admin))
    assert r.status_code == 200 and r.json()["revoked_at"]
    assert api.client.post("/api/v1/runs/x/cancel", headers=api.h(secret)).status_code == 401
    assert api.client.delete("/api/v1/tokens/nope", headers=api.h(api.admin)).status_code == 404


def test_token_create_validates_scopes(api: Api) -> None:
    for body in [{"scopes": ["root"]}, {"scopes": []}, {"scopes": ["read"], "x": 1}]:
        r = api.client.post("/api/v1/tokens", json=body, headers=api.h(api.admin))
        assert r.status_code == 422, body


def test_token_cli(sqlite_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["token", "create", "--scope", "run", "--name", "ci", "--database-url", sqlite_url])
        == 0
    )
    secret = capsys.readouterr().out.strip()
    assert secret.startswith("tt_")
    assert main(["token", "list", "--json", "--database-url", sqlite_url]) == 0
    out = capsys.readouterr().out
    assert "ci" in out and secret not in out
    token_id = json.loads(out)[0]["id"]
    assert main(["token", "revoke", token_id, "--database-url", sqlite_url]) == 0
    assert main(["token", "revoke", "nope", "--database-url", sqlite_url]) == 2
    with pytest.raises(SystemExit) as e:
        main(["token", "create", "--scope", "root", "--database-url", sqlite_url])
    assert e.value.code == 2
