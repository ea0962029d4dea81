"""A NUL character (U+0000) in anything a user sends -- a path or query parameter, a JSON
field of any body (run, sweep, note, tags, token, baseline, probe, annotation, capacity), a
form field (launch, sweep, probe, run actions, sign-in), an import file of each format or
its name -- is refused with a 4xx naming the field and changes nothing; the worker's own
names (hostname, worker name, client host and version) likewise. PostgreSQL's ``text``
cannot hold NUL, so each of these was a 500 there (issue 23). Every case runs on SQLite
and PostgreSQL; a test walks its cases and lists every one that fails."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.api.app import create_app
from app.cli.main import main as cli_main
from app.settings import Settings
from app.storage import models_compare, models_interop, models_probes  # noqa: F401 (tables)
from app.storage.models import Base, UTCDateTime
from tests.api_support import CAPS, SPEC, Api, api_client, wire
from tests.web_support import CSV_LOG, post_form, sign_in

pytestmark = pytest.mark.timeout(180)

NUL = "\x00"
FIXTURES = Path(__file__).parent / "fixtures" / "interop"


@pytest.fixture
def api(db_url: str) -> Iterator[Api]:
    with api_client(db_url) as a:
        yield a


@pytest.fixture
def raw(api: Api) -> TestClient:
    """The same app, answering 500s instead of raising them into the test."""
    return TestClient(api.app, raise_server_exceptions=False)


def snapshot(api: Api) -> dict[str, list[str]]:
    """Every row of every table (times left out: a request may touch ``last_used_at``)."""
    out: dict[str, list[str]] = {}
    with api.sessions() as s:
        for table in Base.metadata.sorted_tables:
            cols = [c for c in table.columns if not isinstance(c.type, UTCDateTime)]
            out[table.name] = sorted(repr(tuple(r)) for r in s.execute(select(*cols)))
    return out


def _refused(r: Any, status: int | tuple[int, ...] = 422) -> str | None:
    """None when ``r`` is the expected 4xx; else what was wrong."""
    want = (status,) if isinstance(status, int) else status
    if r.status_code not in want:
        return f"HTTP {r.status_code}: {r.text[:200]}"
    return None


def _loc_of(r: Any) -> list[Any]:
    try:
        detail = r.json()["detail"]
    except (ValueError, KeyError, TypeError):
        return []
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        return list(detail[0].get("loc") or [])
    return []


def _msg_of(r: Any) -> str:
    try:
        return json.dumps(r.json())
    except ValueError:
        return str(r.text)


def _check_all(failures: list[str]) -> None:
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------ path and query


def _operations(app: Any) -> list[tuple[str, str]]:
    doc = app.openapi()
    return [
        (method.upper(), path)
        for path, item in doc["paths"].items()
        for method in item
        if method in ("get", "post", "put", "delete", "patch")
    ]


PAGES = (
    "/runs/a%00b",
    "/runs/a%00b/requests",
    "/runs/a%00b/requests/0",
    "/runs/a%00b/requests.csv",
    "/sweeps/a%00b",
    "/probes/a%00b",
    "/static/a%00b.css",
    "/a%00b",
)


def test_nul_in_any_path_or_query_is_a_400_before_anything_runs(api: Api, raw: TestClient) -> None:
    """Every API operation with a NUL in each path parameter, every operation with a NUL in a
    query value and in a query name, and the pages: 400 naming the path or the query field,
    for an anonymous caller and an admin alike."""
    ops = _operations(api.app)
    assert len(ops) >= 40
    before = snapshot(api)
    failures: list[str] = []
    for method, path in ops:
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        urls: list[tuple[str, list[Any]]] = [
            (concrete + "?limit=1&q=a%00b", ["query", "q"]),
            (concrete + "?a%00b=1", ["query"]),
        ]
        if "{" in path:
            urls.append((re.sub(r"\{[^}]+\}", "a%00b", path), ["path"]))
        for url, loc in urls:
            for token in (None, api.admin):
                r = raw.request(method, url, headers=api.h(token))
                bad = _refused(r, 400)
                if bad is None and _loc_of(r)[: len(loc)] != loc:
                    bad = f"loc {_loc_of(r)} is not {loc}"
                if bad is None and "NUL" not in r.text:
                    bad = f"the answer does not say NUL: {r.text[:200]}"
                if bad:
                    failures.append(f"{method} {url} ({'admin' if token else 'anonymous'}): {bad}")
    for url in PAGES + tuple(p + "?x=%00" for p in ("/", "/runs/x", "/compare", "/capacity")):
        r = raw.get(url, headers={"accept": "text/html"})
        bad = _refused(r, 400)
        if bad:
            failures.append(f"GET {url} (page): {bad}")
    _check_all(failures)
    assert snapshot(api) == before


def test_a_clean_path_and_query_still_pass(api: Api, raw: TestClient) -> None:
    rid = api.create_run(name="fine")["run_id"]
    assert raw.get(f"/api/v1/runs/{rid}", headers=api.h(api.read)).status_code == 200
    r = raw.get("/api/v1/runs", params={"model": "sim", "limit": 5}, headers=api.h(api.read))
    assert r.status_code == 200 and r.json()["total"] == 1
    assert raw.get("/api/v1/runs/a%01b", headers=api.h(api.read)).status_code == 404


# ------------------------------------------------------------------ JSON bodies

Case = tuple[str, str, str, Callable[[dict[str, str]], dict[str, Any]], list[Any], str]


def _nested(path: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cur = out
    keys = path.split(".")
    for k in keys[:-1]:
        cur = cur.setdefault(k, {})
    cur[keys[-1]] = value
    return out


def _run_case(field: str, value: Any, loc: list[Any] | None = None) -> Case:
    body = SPEC | _nested(field, value)
    where = loc or ["body", field.split(".")[0]]
    return ("POST", "/api/v1/runs", "run", lambda _: body, where, "run")


SWEEP = SPEC | {"rates": [1.0, 2.0]}
BODY_CASES: dict[str, Case] = {
    "run name": _run_case("name", "a\x00b"),
    "run model": _run_case("model", "a\x00b"),
    "run base_url": _run_case("base_url", "http://127.0.0.1:9/a\x00b"),
    "run engine": _run_case("engine", "vllm\x00"),
    "run engine_version": _run_case("engine_version", "0.1\x00"),
    "run dtype": _run_case("dtype", "bf\x0016"),
    "run engine_flags": _run_case("engine_flags", "--x\x00"),
    "run tags": _run_case("tags", ["ok", "a\x00b"]),
    "run extra_body": _run_case("extra_body", {"x": {"y": ["a\x00b"]}}),
    "run extra_body key": _run_case("extra_body", {"a\x00b": 1}),
    "run headers": _run_case("headers", {"X-Lab": "a\x00b"}),
    "run metrics_series": _run_case("metrics_series", ["vllm:x\x00"]),
    "run metrics_url": _run_case("metrics_url", "http://127.0.0.1:9/m\x00"),
    "run dataset_path": _run_case("dataset_path", "/tmp/a\x00b.jsonl"),
    "run tokenizer": _run_case("tokenizer", "/tmp/tok\x00"),
    "run api_key": _run_case("api_key", "sk-\x00"),
    "run requirements": _run_case("requirements.labels", {"pool": "a\x00b"}),
    "run requirements gpu": _run_case("requirements.gpu_name", "H100\x00"),
    "sweep name": ("POST", "/api/v1/sweeps", "run", lambda _: SWEEP | {"name": "s\x00"},
                   ["body", "name"], "sweep"),
    "sweep model": ("POST", "/api/v1/sweeps", "run", lambda _: SWEEP | {"model": "m\x00"},
                    ["body", "model"], "sweep"),
    "note": ("PUT", "/api/v1/runs/{run}/note", "run", lambda _: {"note": "a\x00b"},
             ["body", "note"], "note"),
    "tags": ("PUT", "/api/v1/runs/{run}/tags", "run", lambda _: {"tags": ["x", "a\x00b"]},
             ["body", "tags"], "tags"),
    "token name": ("POST", "/api/v1/tokens", "admin",
                   lambda _: {"scopes": ["read"], "name": "a\x00b"}, ["body", "name"], "token"),
    "baseline name": ("POST", "/api/v1/baselines", "run",
                      lambda ids: {"name": "b\x00", "target_id": ids["run"]}, ["body", "name"],
                      "baseline"),
    "baseline note": ("POST", "/api/v1/baselines", "run",
                      lambda ids: {"name": "b", "target_id": ids["run"], "note": "n\x00"},
                      ["body", "note"], "baseline"),
    "baseline target": ("POST", "/api/v1/baselines", "run",
                        lambda ids: {"name": "b", "target_id": ids["run"] + "\x00"},
                        ["body", "target_id"], "baseline"),
    "probe name": ("POST", "/api/v1/probes", "run",
                   lambda _: {"kind": "linear", "device": "cpu", "name": "p\x00"},
                   ["body", "name"], "probe"),
    "probe model_path": ("POST", "/api/v1/probes", "run",
                         lambda _: {"kind": "batch_scaling", "device": "cpu",
                                    "params": {"model_path": "/m\x00"}},
                         ["body", "params"], "probe"),
    "annotation model": ("PUT", "/api/v1/runs/{run}/annotation", "run",
                         lambda _: {"model": "llama-3-8b\x00"}, ["body", "model"], "annotation"),
    "annotation device": ("PUT", "/api/v1/runs/{run}/annotation", "run",
                          lambda _: {"model": "llama-3-8b", "device": "h100-sxm\x00"},
                          ["body", "device"], "annotation"),
    "capacity model": ("POST", "/api/v1/capacity", "run", lambda _: {"model": "x\x00"},
                       ["body", "model"], "capacity"),
    "worker name": ("POST", "/api/v1/workers/register", "worker",
                    lambda _: {"name": "w\x00", "capabilities": CAPS}, ["body", "name"], "worker"),
    "worker hostname": ("POST", "/api/v1/workers/register", "worker",
                        lambda _: {"capabilities": CAPS | {"hostname": "h\x00"}},
                        ["body", "capabilities", "hostname"], "worker"),
    "worker labels": ("POST", "/api/v1/workers/register", "worker",
                      lambda _: {"capabilities": CAPS | {"labels": {"pool": "a\x00"}}},
                      ["body", "capabilities", "labels"], "worker"),
    "client_host": ("POST", "/api/v1/jobs/{job}/complete", "worker",
                    lambda ids: {"lease_id": ids["lease"], "status": "succeeded",
                                 "total_batches": 1,
                                 "run_meta": {"clock_source": "kernel", "client_host": "h\x00"}},
                    ["body", "run_meta", "client_host"], "complete"),
    "client_version": ("POST", "/api/v1/jobs/{job}/complete", "worker",
                       lambda ids: {"lease_id": ids["lease"], "status": "succeeded",
                                    "total_batches": 1,
                                    "run_meta": {"clock_source": "kernel",
                                                 "client_version": "1\x00"}},
                       ["body", "run_meta", "client_version"], "complete"),
}  # fmt: skip


def _leased(api: Api) -> dict[str, str]:
    """A run leased by a worker that uploaded one batch (so ``complete`` would succeed)."""
    out = api.create_run(name="target")
    job = api.lease(api.register())
    assert job is not None
    body = {"lease_id": job["lease_id"], "batch_no": 0, "requests": wire([0])}
    assert api.post_job(out["job_id"], "results", body).status_code == 200
    return {"run": out["run_id"], "job": out["job_id"], "lease": job["lease_id"]}


def test_nul_in_any_json_field_is_a_422_naming_it_and_changes_nothing(
    api: Api, raw: TestClient
) -> None:
    ids = _leased(api)
    tokens = {"run": api.run, "admin": api.admin, "worker": api.worker}
    failures: list[str] = []
    for name, (method, path, scope, body, loc, _) in BODY_CASES.items():
        before = snapshot(api)
        url = path.format(**ids)
        r = raw.request(method, url, json=body(ids), headers=api.h(tokens[scope]))
        bad = _refused(r)
        if bad is None and _loc_of(r)[: len(loc)] != loc:
            bad = f"loc {_loc_of(r)} does not start with {loc}"
        if bad is None and "NUL" not in _msg_of(r):
            bad = f"the message does not say NUL: {_msg_of(r)[:200]}"
        if bad is None and snapshot(api) != before:
            bad = "the database changed"
        if bad:
            failures.append(f"{name}: {method} {url}: {bad}")
    _check_all(failures)
    # the same bodies without the NUL are accepted (each case fails for the NUL alone)
    clean = json.loads(json.dumps(BODY_CASES["run name"][3](ids)).replace("\\u0000", ""))
    r = raw.post("/api/v1/runs", json=clean, headers=api.h(api.run))
    assert r.status_code == 201, r.text
    r = raw.put(f"/api/v1/runs/{ids['run']}/note", json={"note": "ab"}, headers=api.h(api.run))
    assert r.status_code == 200 and r.json()["note"] == "ab"


# ------------------------------------------------------------------ forms


FORM = {"base_url": "http://127.0.0.1:9", "model": "m", "num_prompts": "2", "endpoint": "chat"}
SWEEP_FORM = FORM | {"sweep_mode": "rates", "loads": "2, 4"}
PROBE_FORM = {"kind": "linear", "device": "cpu", "linear_width": "16"}
FORM_CASES: dict[str, tuple[str, dict[str, str], str]] = {
    "launch name": ("/launch", FORM | {"name": "a\x00b"}, "name"),
    "launch model": ("/launch", FORM | {"model": "m\x00"}, "model"),
    "launch headers": ("/launch", FORM | {"headers": "X-Lab: a\x00"}, "headers"),
    "sweep name": ("/launch/sweep", SWEEP_FORM | {"name": "s\x00"}, "name"),
    "probe name": ("/launch/probe", PROBE_FORM | {"name": "p\x00"}, "name"),
    "run tags": ("/runs/{run}/tags", {"tags": "a, b\x00"}, "tags"),
    "run note": ("/runs/{run}/note", {"note": "a\x00b"}, "note"),
    "run baseline": ("/runs/{run}/baseline", {"baseline_name": "b\x00"}, "baseline_name"),
    "a field's name": ("/runs/{run}/note", {"note": "fine", "x\x00": "1"}, "x"),
}


def test_nul_in_any_form_field_is_a_422_naming_it_and_changes_nothing(api: Api) -> None:
    ids = _leased(api)
    failures: list[str] = []
    with TestClient(api.app, raise_server_exceptions=False) as c:
        assert sign_in(c, api.run).status_code == 303
        for name, (path, data, field) in FORM_CASES.items():
            before = snapshot(api)
            r = post_form(c, path.format(**ids), data, follow_redirects=False)
            bad = _refused(r)
            if bad is None and (field not in r.text or "NUL" not in r.text):
                bad = f"the page does not name {field!r} and NUL"
            if bad is None and snapshot(api) != before:
                bad = "the database changed"
            if bad:
                failures.append(f"{name}: POST {path}: {bad}")
        # the launch form without the NUL launches
        r = post_form(c, "/launch", FORM | {"name": "ab"}, follow_redirects=False)
        assert r.status_code == 303, r.text[:300]
    with TestClient(api.app, raise_server_exceptions=False) as anon:
        before = snapshot(api)
        r = post_form(anon, "/signin", {"token": api.run + "\x00", "next": "/"})
        bad = _refused(r)
        if bad is None and snapshot(api) != before:
            bad = "the database changed"
        if bad:
            failures.append(f"sign-in token: {bad}")
    _check_all(failures)


# ------------------------------------------------------------------ imports


def _vllm(**extra: Any) -> dict[str, Any]:
    return {
        "duration": 1.0,
        "completed": 2,
        "model_id": "m",
        "input_lens": [10, 10],
        "output_lens": [3, 3],
        "ttfts": [0.05, 0.06],
        "itls": [[0.01, 0.01], [0.01, 0.01]],
        "start_times": [0.0, 0.1],
    } | extra


def _guidellm(where: str) -> str:
    """The GuideLLM fixture with a NUL in its backend's model, or in an errored request."""
    doc = json.loads((FIXTURES / "guidellm-benchmarks.json").read_text())
    if where == "model":
        doc["config"]["spec"]["backend"]["model"] = "sim\x00"
    else:
        groups = doc["benchmarks"][0]["requests"]
        req = groups["successful"].pop()
        req["info"]["error"] = "bad\x00input"
        groups["errored"].append(req)
    return json.dumps(doc)


def _aiperf_error() -> str:
    """The AIPerf fixture (requests with errors) with a NUL in an error message."""
    out: list[str] = []
    done = False
    for line in (FIXTURES / "aiperf-errors" / "profile_export.jsonl").read_text().splitlines():
        obj = json.loads(line)
        if not done and isinstance(obj.get("error"), dict):
            obj["error"]["message"] = "bad\x00input"
            done = True
        out.append(json.dumps(obj))
    assert done, "the fixture has no errored request"
    return "\n".join(out) + "\n"


IMPORT_CASES: dict[str, tuple[str, str, dict[str, str]]] = {
    "csv NUL byte": ("csv", CSV_LOG.replace("r2,", "r\x002,"), {}),
    "vllm model": ("vllm", json.dumps(_vllm(model_id="m\x00")), {}),
    "vllm error": ("vllm", json.dumps(_vllm(errors=["", "bad\x00input"])), {}),
    "vllm appended": ("vllm", json.dumps(_vllm()) + "\n" + json.dumps(_vllm(model_id="\x00")), {}),
    "guidellm model": ("guidellm", _guidellm("model"), {}),
    "guidellm error": ("guidellm", _guidellm("error"), {}),
    "aiperf error": ("aiperf", _aiperf_error(), {}),
    "name field": ("csv", CSV_LOG, {"name": "run\x00"}),
}


def _post_import(raw: TestClient, api: Api, fmt: str, text: str, extra: dict[str, str],
                 filename: str = "f") -> Any:  # fmt: skip
    return raw.post(
        "/api/v1/imports",
        data={"format": fmt} | extra,
        files={"file": (filename, text.encode("utf-8"), "application/octet-stream")},
        headers=api.h(api.run),
    )


def _raw_multipart(raw: TestClient, api: Api, filename: bytes) -> Any:
    """A CSV import whose multipart part names ``filename`` byte for byte."""
    boundary = b"nulboundary"
    body = b"".join(
        [
            b"--" + boundary + b'\r\nContent-Disposition: form-data; name="format"\r\n\r\ncsv\r\n',
            b"--" + boundary + b'\r\nContent-Disposition: form-data; name="file"; filename="',
            filename + b'"\r\nContent-Type: text/csv\r\n\r\n' + CSV_LOG.encode() + b"\r\n",
            b"--" + boundary + b"--\r\n",
        ]
    )
    kind = f"multipart/form-data; boundary={boundary.decode()}"
    headers = api.h(api.run) | {"content-type": kind}
    return raw.post("/api/v1/imports", content=body, headers=headers)


def test_nul_in_an_import_of_each_format_is_a_422_and_stores_nothing(
    api: Api, raw: TestClient
) -> None:
    failures: list[str] = []
    for name, (fmt, text, extra) in IMPORT_CASES.items():
        before = snapshot(api)
        r = _post_import(raw, api, fmt, text, extra)
        bad = _refused(r)
        if bad is None and "NUL" not in _msg_of(r):
            bad = f"the message does not say NUL: {_msg_of(r)[:200]}"
        if bad is None and snapshot(api) != before:
            bad = "the database changed"
        if bad:
            failures.append(f"{name}: {bad}")
    before = snapshot(api)
    r = _raw_multipart(raw, api, b"log\x00.csv")  # clients escape it: this one does not
    if _refused(r) is not None or "NUL" not in _msg_of(r) or snapshot(api) != before:
        failures.append(f"file name: HTTP {r.status_code}: {r.text[:200]}")
    _check_all(failures)
    # the good files themselves import
    assert _post_import(raw, api, "vllm", json.dumps(_vllm()), {}).status_code == 201
    assert _post_import(raw, api, "csv", CSV_LOG, {"name": "ok"}).status_code == 201


def test_the_import_page_refuses_a_nul_name(api: Api) -> None:
    with TestClient(api.app, raise_server_exceptions=False) as c:
        assert sign_in(c, api.run).status_code == 303
        before = snapshot(api)
        r = c.post(
            "/import",
            data={"format": "csv", "name": "a\x00b", "csrf": _csrf(c)},
            files={"file": ("log.csv", CSV_LOG.encode(), "text/csv")},
            headers={"Origin": str(c.base_url).rstrip("/")},
            follow_redirects=False,
        )
        assert r.status_code == 422, r.text[:300]
        assert "NUL" in r.text and snapshot(api) == before


def _csrf(c: TestClient) -> str:
    m = re.search(r'name="csrf" value="([^"]*)"', c.get("/import").text)
    assert m
    return m.group(1)


def test_the_cli_import_of_a_file_with_nul_exits_nonzero_with_one_line(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "v.json"
    f.write_text(json.dumps(_vllm(model_id="m\x00")))
    code = cli_main(["import", "vllm", str(f), "--database-url", db_url])
    err = capsys.readouterr().err.strip()
    assert code not in (0, None) and "NUL" in err and len(err.splitlines()) == 1, err
    app = create_app(Settings(database_url=db_url, local_worker=False))
    with TestClient(app) as c, c.app.state.sessions() as s:  # type: ignore[attr-defined]
        from app.storage.models import Run

        assert s.scalars(select(Run)).all() == []
