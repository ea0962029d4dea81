"""Bad input gets a 4xx naming the field, never a 500, and changes nothing (issue 14).

Each case was a 500 (or, for ``output_lens``, silently accepted) before its fix: integers
past 64 bits in a result upload, an unknown ``clock_source`` at job completion (the run then
stayed ``running`` for ever), a 20-digit request index, ``memory_gib=1e308``, an
``extra_body`` nested 900 deep, ``num_prompts: 1e999``, a CSV field over 128 KiB, a
4001-digit number and ``output_lens: 1e12`` in a vLLM result file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.protocol.wire import WireRequest
from app.storage.models import JobBatch, Request, Run
from tests.api_support import SPEC, Api, api_client, record, wire

pytestmark = pytest.mark.timeout(60)

BIG = 2**64  # one past what any 64-bit column holds
TWENTY_DIGITS = "9" * 20


@pytest.fixture
def api(db_url: str) -> Iterator[Api]:
    with api_client(db_url) as a:
        yield a


@pytest.fixture
def raw(api: Api) -> TestClient:
    """The same app, answering 500s instead of raising them into the test."""
    return TestClient(api.app, raise_server_exceptions=False)


def _count(api: Api, model: type[Any]) -> int:
    with api.sessions() as s:
        return int(s.scalar(select(func.count()).select_from(model)) or 0)


def _loc(r: Any) -> list[Any]:
    assert r.status_code == 422, (r.status_code, r.text[:500])
    loc: list[Any] = r.json()["detail"][0]["loc"]
    return loc


def _leased(api: Api, **spec: Any) -> tuple[str, str, str]:
    out = api.create_run(**spec)
    job = api.lease(api.register())
    assert job is not None
    return out["run_id"], out["job_id"], job["lease_id"]


# ------------------------------------------------------------------ worker uploads


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("input_tokens", BIG),
        ("output_tokens", BIG),
        ("usage_completion_tokens", 2**63),
        ("cached_prompt_tokens", 2**63),
        ("scheduled_ns", BIG),
        ("sent_ns", -BIG),
        ("end_ns", BIG),
        ("done_ns", BIG),
        ("http_status", BIG),
        ("index", BIG),
    ],
)
def test_upload_integers_out_of_range_are_422_naming_the_field(
    api: Api, raw: TestClient, field: str, value: int
) -> None:
    _, jid, lid = _leased(api)
    req = wire([0])[0] | {field: value}
    body = {"lease_id": lid, "batch_no": 0, "requests": [req]}
    r = raw.post(f"/api/v1/jobs/{jid}/results", json=body, headers=api.h(api.worker))
    assert _loc(r) == ["body", "requests", 0, field]
    assert _count(api, JobBatch) == 0 and _count(api, Request) == 0
    ok = api.post_job(jid, "results", {"lease_id": lid, "batch_no": 0, "requests": wire([0])})
    assert ok.json()["accepted"] == 1  # the refused upload left batch 0 free


def test_batch_number_past_its_column_is_422(api: Api, raw: TestClient) -> None:
    _, jid, lid = _leased(api)
    for no in (2**31, BIG):
        body = {"lease_id": lid, "batch_no": no, "requests": wire([0])}
        r = raw.post(f"/api/v1/jobs/{jid}/results", json=body, headers=api.h(api.worker))
        assert _loc(r) == ["body", "batch_no"]
    assert _count(api, JobBatch) == 0


def test_token_counts_past_int32_are_stored(api: Api) -> None:
    """BIGINT token columns (migration 0009): 3e9 tokens was a 500 on PostgreSQL."""
    rid, jid, lid = _leased(api)
    req = wire([0])[0] | {"input_tokens": 3_000_000_000, "usage_prompt_tokens": 2**40}
    body = {"lease_id": lid, "batch_no": 0, "requests": [req]}
    assert api.post_job(jid, "results", body).json()["accepted"] == 1
    with api.sessions() as s:
        row = s.scalars(select(Request).where(Request.run_id == rid)).one()
        assert (row.input_tokens, row.usage_prompt_tokens) == (3_000_000_000, 2**40)


def test_counts_a_target_reported_are_kept_when_they_fit(api: Api) -> None:
    """Usage counts come from the target: a negative one fits and is stored as reported (it
    was before); one past 64 bits is sent by the worker as unknown, so its batch lands."""
    rid, jid, lid = _leased(api)
    rec = record(0)
    rec.usage_completion_tokens = -1
    rec.usage_prompt_tokens = 10**30
    w = WireRequest.from_record(rec)
    assert w.usage_prompt_tokens is None and w.usage_completion_tokens == -1
    body = {"lease_id": lid, "batch_no": 0, "requests": [w.model_dump(mode="json")]}
    assert api.post_job(jid, "results", body).json()["accepted"] == 1
    with api.sessions() as s:
        row = s.scalars(select(Request).where(Request.run_id == rid)).one()
        assert (row.usage_completion_tokens, row.usage_prompt_tokens) == (-1, None)


def test_invalid_clock_source_at_complete_is_422_and_commits_nothing(
    api: Api, raw: TestClient
) -> None:
    rid, jid, lid = _leased(api)
    assert api.post_job(jid, "heartbeat", {"lease_id": lid}).status_code == 200
    body = {"lease_id": lid, "batch_no": 0, "requests": wire([0, 1])}
    assert api.post_job(jid, "results", body).status_code == 200
    done: dict[str, Any] = {
        "lease_id": lid,
        "status": "succeeded",
        "total_batches": 1,
        "run_meta": {"clock_source": "sundial", "client_host": "h"},
    }
    r = raw.post(f"/api/v1/jobs/{jid}/complete", json=done, headers=api.h(api.worker))
    assert _loc(r) == ["body", "run_meta", "clock_source"]
    assert api.client.get(f"/api/v1/jobs/{jid}").json()["state"] == "running"
    run = api.client.get(f"/api/v1/runs/{rid}").json()["run"]
    assert run["status"] == "running" and run["finished_at"] is None
    done["run_meta"]["clock_source"] = "kernel"  # the worker's corrected retry completes it
    assert api.post_job(jid, "complete", done).json()["state"] == "succeeded"
    assert api.client.get(f"/api/v1/runs/{rid}").json()["run"]["status"] == "succeeded"


def test_complete_integers_out_of_range_are_422(api: Api, raw: TestClient) -> None:
    _, jid, lid = _leased(api)
    for extra, loc in (
        ({"total_batches": BIG}, ["body", "total_batches"]),
        (
            {"total_batches": 0, "run_meta": {"start_mono_ns": BIG}},
            ["body", "run_meta", "start_mono_ns"],
        ),
    ):
        done = {"lease_id": lid, "status": "succeeded"} | extra
        r = raw.post(f"/api/v1/jobs/{jid}/complete", json=done, headers=api.h(api.worker))
        assert _loc(r) == loc
    assert api.client.get(f"/api/v1/jobs/{jid}").json()["state"] == "leased"
    # the largest valid count is answered at once: it named range(2^64) in a set (memory
    # exhausted, the server killed) before; now the first missing batches are named
    done = {"lease_id": lid, "status": "succeeded", "total_batches": 2**31 - 1}
    r = raw.post(f"/api/v1/jobs/{jid}/complete", json=done, headers=api.h(api.worker))
    assert r.status_code == 409 and "batches missing: [0, 1, 2," in r.json()["detail"]
    assert len(r.text) < 10_000


# ------------------------------------------------------------------ reads


def test_twenty_digit_request_index_is_4xx(api: Api, raw: TestClient) -> None:
    rid = api.create_run()["run_id"]
    page = raw.get(f"/runs/{rid}/requests/{TWENTY_DIGITS}")
    assert page.status_code in (404, 422), page.text[:300]
    r = raw.get(f"/api/v1/runs/{rid}/requests/{TWENTY_DIGITS}/events")
    assert _loc(r) == ["path", "index"]


@pytest.mark.parametrize("value", ["1e308", "1e999", "inf"])
def test_capacity_memory_out_of_range_is_422(raw: TestClient, value: str) -> None:
    r = raw.get("/api/v1/capacity", params={"memory_gib": value})
    assert _loc(r) == ["query", "memory_gib"]
    page = raw.get("/capacity", params={"memory_gib": value})
    assert page.status_code < 500, page.text[:300]


# ------------------------------------------------------------------ run specs


def _post_run(api: Api, raw: TestClient, text: str) -> Any:
    headers = api.h(api.run) | {"content-type": "application/json"}
    return raw.post("/api/v1/runs", content=text.encode(), headers=headers)


def test_extra_body_nested_too_deep_is_422(api: Api, raw: TestClient) -> None:
    deep = "[" * 900 + "]" * 900
    r = _post_run(api, raw, json.dumps(SPEC)[:-1] + f', "extra_body": {{"x": {deep}}}}}')
    assert _loc(r) == ["body", "extra_body"]
    assert "32" in r.json()["detail"][0]["msg"]
    ok = {"x": [[[{"temperature": 0.5}]]]}  # modest nesting is fine
    assert api.create_run(extra_body=ok)["run_id"]
    assert _count(api, Run) == 1


def test_non_finite_number_for_an_integer_field_is_422(api: Api, raw: TestClient) -> None:
    r = _post_run(api, raw, json.dumps(SPEC)[:-1] + ', "num_prompts": 1e999}')
    assert _loc(r) == ["body", "num_prompts"]
    r = _post_run(api, raw, json.dumps(SPEC)[:-1] + ', "request_rate": NaN}')
    assert _loc(r) == ["body", "request_rate"]
    assert _count(api, Run) == 0


# ------------------------------------------------------------------ imports


def _import(api: Api, raw: TestClient, fmt: str, text: str) -> Any:
    return raw.post(
        "/api/v1/imports",
        data={"format": fmt},
        files={"file": ("f", text.encode(), "application/octet-stream")},
        headers=api.h(api.run),
    )


HEADER = "request_id,start_ts,first_token_ts,end_ts,input_tokens,output_tokens\n"


def test_csv_field_over_128_kib_is_422_naming_the_row(api: Api, raw: TestClient) -> None:
    text = HEADER + "a,100.0,100.05,100.5,10,20\n" + "b" * (200 * 1024) + ",1,2,3,4,5\n"
    r = _import(api, raw, "csv", text)
    assert _loc(r) == ["body", "file"]
    assert "row 2" in r.json()["detail"][0]["msg"]
    assert _count(api, Run) == 0


def _vllm(**detail: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "duration": 1.0,
        "completed": 2,
        "input_lens": [10, 10],
        "output_lens": [3, 3],
        "ttfts": [0.05, 0.06],
        "itls": [[0.01, 0.01], [0.01, 0.01]],
        "start_times": [0.0, 0.1],
    }
    return obj | detail


def test_vllm_import_good_file_is_accepted(api: Api) -> None:
    r = api.client.post(
        "/api/v1/imports",
        data={"format": "vllm"},
        files={"file": ("v.json", json.dumps(_vllm()).encode(), "application/json")},
        headers=api.h(api.run),
    )
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (json.dumps(_vllm())[:-1] + ', "mean_ttft_ms": ' + "9" * 4001 + "}", "mean_ttft_ms"),
        (json.dumps(_vllm(input_lens=[int("9" * 4001), 10])), "input_lens"),
        (json.dumps(_vllm(output_lens=[1e12, 3])), "output_lens"),
        (json.dumps(_vllm(input_lens=[10**12, 10])), "input_lens"),
        ('{"duration": 1, "completed": ' + "9" * 5000 + "}", "out of range"),
    ],
    ids=[
        "4001-digit figure",
        "4001-digit length",
        "output_lens 1e12",
        "input_lens 1e12",
        "5000-digit count",
    ],
)
def test_vllm_import_numbers_out_of_range_are_422(
    api: Api, raw: TestClient, text: str, match: str
) -> None:
    r = _import(api, raw, "vllm", text)
    assert _loc(r) == ["body", "file"]
    assert match in r.json()["detail"][0]["msg"]
    assert _count(api, Run) == 0


# ------------------------------------------------------------------ strings past their column

GUIDELLM = Path(__file__).parent / "fixtures" / "interop" / "guidellm-benchmarks.json"


def test_a_model_name_past_its_column_is_422(api: Api, raw: TestClient) -> None:
    """``runs.model`` is VARCHAR(255): a longer one was a 500 on PostgreSQL."""
    r = raw.post("/api/v1/runs", json=SPEC | {"model": "m" * 256}, headers=api.h(api.run))
    assert _loc(r) == ["body", "model"]
    assert _count(api, Run) == 0
    assert api.create_run(model="m" * 255)["run_id"]


def _guidellm(version: str) -> str:
    doc = json.loads(GUIDELLM.read_text())
    doc["metadata"]["guidellm_version"] = version
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("fmt", "text", "extra", "filename", "match"),
    [
        ("csv", HEADER + "a,100.0,100.05,100.5,10,20\n", {"name": "n" * 256}, "f", "name"),
        ("csv", HEADER + "a,100.0,100.05,100.5,10,20\n", {}, "f" * 256, "file name"),
        ("vllm", json.dumps(_vllm(model_id="m" * 256)), {}, "f", "model"),
        ("guidellm", _guidellm("9" * 80), {}, "f", "tool"),
    ],
    ids=["name", "file name", "vllm model_id", "guidellm version"],
)
def test_import_strings_past_their_columns_are_422(
    api: Api, raw: TestClient, fmt: str, text: str, extra: dict[str, str], filename: str,
    match: str,
) -> None:  # fmt: skip
    """Each was a 500 on PostgreSQL (value too long for its VARCHAR column)."""
    r = raw.post(
        "/api/v1/imports",
        data={"format": fmt} | extra,
        files={"file": (filename, text.encode(), "application/octet-stream")},
        headers=api.h(api.run),
    )
    assert _loc(r) == ["body", "file"]
    assert match in r.json()["detail"][0]["msg"]
    assert _count(api, Run) == 0


def test_a_guidellm_file_with_the_longest_name_imports_as_a_sweep(api: Api) -> None:
    """Its sweep is named after the file (``<file name> (imported)``): it fits its column."""
    r = api.client.post(
        "/api/v1/imports",
        data={"format": "guidellm"},
        files={"file": ("g" * 255, GUIDELLM.read_bytes(), "application/json")},
        headers=api.h(api.run),
    )
    assert r.status_code == 201, r.text
    assert _count(api, Run) == 2


def test_the_import_length_limits_are_the_columns() -> None:
    from app.importers.common import STORED_LENGTHS
    from app.storage.models_interop import RunImport

    columns = {"file name": RunImport.file_name, "name": Run.name, "model": Run.model,
               "tool": RunImport.tool, "profile": RunImport.profile}  # fmt: skip
    assert {k: c.type.length for k, c in columns.items()} == STORED_LENGTHS
    assert Run.model.type.length == 255  # RunSpec.model's max_length
