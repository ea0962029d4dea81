"""The issue-24 pages and forms against hostile ids on SQLite and PostgreSQL: a NUL byte or
an over-long id in a path, a picker or a filter is a 4xx naming what was wrong, never a 500
(PostgreSQL refuses NUL in a string parameter)."""

from __future__ import annotations

from urllib.parse import quote

from fastapi.testclient import TestClient

from app.services import auth
from app.services.runs import open_database
from app.storage import compare_repo
from app.storage.db import session_scope
from tests.web_support import csrf_of, sign_in, web_app

HOSTILE = ("a\x00b", "x" * 5000)


def test_hostile_ids_are_4xx(db_url: str) -> None:
    sessions = open_database(db_url)
    with session_scope(sessions) as s:
        _, secret = auth.create_token(s, scopes=["run"], name="hostile")
    with TestClient(web_app(db_url)) as c:
        assert sign_in(c, secret).status_code == 303
        origin = {"Origin": str(c.base_url).rstrip("/")}
        for bad in HOSTILE:
            for path, params in (
                ("/throughput", {"sweep": bad}),
                ("/throughput", {"run": bad}),
                ("/roofline", {"run": bad}),
                ("/roofline", {"run": bad, "model": "llama-3-8b"}),
                ("/sweeps", {"tag": bad}),
                ("/compare", {"ids": "r1", "baseline": bad}),
                ("/compare", {"ids": bad}),
                ("/compare", {"sweeps": bad}),
                ("/compare", {"ids": "r1", "base": bad}),
            ):
                r = c.get(path, params=params)
                assert r.status_code in (200, 400, 404, 422), (path, params, r.status_code)
            for sub in ("", "/delete"):
                r = c.get(f"/sweeps/{quote(bad)}{sub}")
                assert r.status_code in (400, 404, 422), (sub, r.status_code)
            for action in ("tags", "note", "baseline", "baseline-pin", "delete"):
                body = {"csrf": csrf_of(c, "/sweeps"), "confirm": "delete", "name": bad}
                r = c.post(f"/sweeps/{quote(bad)}/{action}", data=body, headers=origin)
                assert r.status_code in (400, 404, 422), (action, r.status_code)
        # free text with a NUL byte on a real sweep: named beside its field, nothing saved
        with session_scope(sessions) as s:
            sweep_id = compare_repo.create_sweep(s, spec={}, mode="rates", loads=[1.0])
        for action, field in (("tags", "tags"), ("note", "note"), ("baseline", "baseline_name")):
            body = {"csrf": csrf_of(c, "/sweeps"), field: "a\x00b"}
            r = c.post(f"/sweeps/{sweep_id}/{action}", data=body, headers=origin)
            # refused where the form is read (app.protocol.nul), naming the field
            assert r.status_code == 422 and f"{field}:" in r.text, (action, r.status_code)
            assert "NUL" in r.text
        with session_scope(sessions) as s:
            row = compare_repo.find_sweep(s, sweep_id)
            assert row is not None and row.tags == [] and row.note is None
            assert compare_repo.list_baselines(s) == []
