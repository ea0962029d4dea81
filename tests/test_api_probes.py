"""Probes over HTTP on SQLite and PostgreSQL: queue, lease, result with artifacts,
download, telemetry, failures named clearly, annotations, capacity, and the pages."""

from __future__ import annotations

import base64
import gzip
from collections.abc import Iterator
from typing import Any

import pytest

from app.client.spec import RunSpec
from app.domain import RunStatus
from app.storage import repository as repo
from app.storage.db import session_scope
from tests.api_support import Api, api_client


@pytest.fixture
def api(db_url: str) -> Iterator[Api]:
    with api_client(db_url) as a:
        yield a


def _queue(api: Api, **body: Any) -> dict[str, Any]:
    body = {"kind": "linear", "device": "cpu", "params": {"width": 64}} | body
    r = api.client.post("/api/v1/probes", json=body, headers=api.h(api.run))
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def _lease_probe(api: Api) -> dict[str, Any]:
    wid = api.register()
    r = api.client.post(
        f"/api/v1/workers/{wid}/lease", json={"kinds": ["probe"]}, headers=api.h(api.worker)
    )
    assert r.status_code == 200, r.text
    job: dict[str, Any] = r.json()["job"]
    assert job is not None and job["kind"] == "probe"
    return job


TRACE = gzip.compress(b'{"traceEvents": []}')
RESULT = {
    "width": 64,
    "shapes": {
        "prefill": {
            "m": 256,
            "k": 64,
            "n": 256,
            "dtype": "bf16",
            "flops": 8388608.0,
            "bytes": 196608.0,
            "intensity": 42.7,
            "median_ms": 0.01,
            "spread": 0.1,
            "flops_s": 8.4e11,
            "bytes_s": 1.9e10,
            "peak_tensor_bytes": 196608.0,
            "peak_tensor_source": "computed",
            "trace": "trace-prefill.json.gz",
            "top_kernels": [{"name": "aten::mm", "calls": 3, "self_us": 9.0, "clock": "cpu"}],
        },
    },
    "sweep": [],
    "weight_shape": [64, 256],
    "dtype": "bf16",
}


def test_probe_job_end_to_end(api: Api) -> None:
    q = _queue(api, name="lin")
    job = _lease_probe(api)
    assert job["job_id"] == q["job_id"] and job["spec"]["probe_id"] == q["probe_id"]
    assert job["spec"]["probe"]["params"]["width"] == 64
    lid = job["lease_id"]
    assert api.post_job(job["job_id"], "heartbeat", {"lease_id": lid}).status_code == 200
    assert api.client.get(f"/api/v1/probes/{q['probe_id']}").json()["status"] == "running"
    body = {
        "lease_id": lid,
        "status": "succeeded",
        "fingerprint": {"device_type": "cpu", "device_name": "CPU: test", "label": "CPU"},
        "result": RESULT,
        "telemetry": [],
        "artifacts": [
            {
                "name": "trace-prefill.json.gz",
                "content_type": "application/gzip",
                "data_b64": base64.b64encode(TRACE).decode(),
            }
        ],
    }
    r = api.post_job(job["job_id"], "probe-result", body)
    assert r.status_code == 200, r.text
    assert r.json() == {
        "probe_id": q["probe_id"],
        "status": "succeeded",
        "duplicate": False,
        "artifacts": 1,
    }
    again = api.post_job(job["job_id"], "probe-result", body)
    assert again.status_code == 200 and again.json()["duplicate"] is True
    tele = {
        "lease_id": lid,
        "seq": 0,
        "samples": [{"t_s": 0.0, "util_pct": 50.0, "power_w": 300.0}],
    }
    assert api.post_job(job["job_id"], "telemetry", tele).json() == {
        "accepted": 1,
        "duplicate": False,
    }
    assert api.post_job(job["job_id"], "telemetry", tele).json()["duplicate"] is True
    done = api.post_job(
        job["job_id"], "complete", {"lease_id": lid, "status": "succeeded", "total_batches": 0}
    )
    assert done.status_code == 200 and done.json()["state"] == "succeeded", done.text
    p = api.client.get(f"/api/v1/probes/{q['probe_id']}").json()
    assert p["status"] == "succeeded" and p["device_label"] == "CPU"
    assert p["artifacts"] == [
        {"name": "trace-prefill.json.gz", "content_type": "application/gzip", "size": len(TRACE)}
    ]
    a = api.client.get(f"/api/v1/probes/{q['probe_id']}/artifacts/trace-prefill.json.gz")
    assert a.status_code == 200 and a.content == TRACE
    assert a.headers["content-type"] == "application/gzip"
    assert api.client.get(f"/api/v1/probes/{q['probe_id']}/artifacts/nope").status_code == 404
    t = api.client.get(f"/api/v1/jobs/{job['job_id']}/telemetry").json()
    assert t["samples"][0]["util_pct"] == 50.0
    page = api.client.get(f"/probes/{q['probe_id']}")
    assert page.status_code == 200 and "aten::mm" in page.text and "CPU" in page.text
    assert "trace-prefill.json.gz" in page.text
    listing = api.client.get("/api/v1/probes?kind=linear").json()["items"]
    assert [x["id"] for x in listing] == [q["probe_id"]]
    assert api.client.get(f"/jobs/{job['job_id']}/telemetry").status_code == 200


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "gpu-burn"}, "kind"),
        ({"kind": "linear", "device": "tpu"}, "device"),
        ({"kind": "batch_scaling", "params": {}}, "model_path"),
        ({"kind": "batch_scaling", "params": {"model_path": "x", "batches": [4, 1]}}, "batches"),
        ({"kind": "linear", "params": {"width": 0}}, "width"),
    ],
)
def test_bad_probe_specs_name_the_field(api: Api, body: dict[str, Any], field: str) -> None:
    r = api.client.post("/api/v1/probes", json=body, headers=api.h(api.run))
    assert r.status_code == 422 and field in r.text
    assert api.client.get("/api/v1/probes").json()["items"] == []


def test_probe_needs_run_scope(api: Api) -> None:
    r = api.client.post("/api/v1/probes", json={"kind": "linear"}, headers=api.h(api.read))
    assert r.status_code == 403


def test_failed_probe_and_lost_lease(api: Api) -> None:
    q = _queue(api, device="cuda")
    job = _lease_probe(api)
    wrong = api.post_job(
        job["job_id"], "probe-result", {"lease_id": "x" * 32, "status": "failed", "error": "e"}
    )
    assert wrong.status_code == 409
    no_err = api.post_job(
        job["job_id"], "probe-result", {"lease_id": job["lease_id"], "status": "failed"}
    )
    assert no_err.status_code == 422 and "error" in no_err.text
    msg = "CUDA was requested but is not available here; no silent fallback"
    r = api.post_job(
        job["job_id"],
        "probe-result",
        {"lease_id": job["lease_id"], "status": "failed", "error": msg},
    )
    assert r.status_code == 200
    api.post_job(
        job["job_id"],
        "complete",
        {"lease_id": job["lease_id"], "status": "failed", "error": msg, "total_batches": 0},
    )
    p = api.client.get(f"/api/v1/probes/{q['probe_id']}").json()
    assert p["status"] == "failed" and p["error"] == msg
    assert "no silent fallback" in api.client.get(f"/probes/{q['probe_id']}").text


def test_job_ending_without_result_fails_the_probe(api: Api) -> None:
    q = _queue(api)
    job = _lease_probe(api)
    api.post_job(
        job["job_id"],
        "complete",
        {
            "lease_id": job["lease_id"],
            "status": "failed",
            "error": "worker crashed",
            "total_batches": 0,
        },
    )
    p = api.client.get(f"/api/v1/probes/{q['probe_id']}").json()
    assert p["status"] == "failed" and p["error"] == "worker crashed"


def test_artifact_over_the_cap_is_refused_whole(db_url: str) -> None:
    with api_client(db_url, probe_artifact_max_mb=0.0001) as api:
        q = _queue(api)
        job = _lease_probe(api)
        big = base64.b64encode(b"x" * 1000).decode()
        r = api.post_job(
            job["job_id"],
            "probe-result",
            {
                "lease_id": job["lease_id"],
                "status": "succeeded",
                "result": RESULT,
                "artifacts": [{"name": "big.bin", "data_b64": big}],
            },
        )
        assert r.status_code == 422 and "limit" in r.text
        p = api.client.get(f"/api/v1/probes/{q['probe_id']}").json()
        assert p["status"] == "running" and p["result"] is None and p["artifacts"] == []


def test_capacity_api(api: Api) -> None:
    r = api.client.get(
        "/api/v1/capacity",
        params={
            "model": "llama-3-8b",
            "memory_gib": 32,
            "utilization": 0.75,
            "context": 8192,
            "concurrency": 16,
            "device": "",
        },
    )
    assert r.status_code == 200, r.text
    p = r.json()["plan"]
    assert p["kv_bytes_per_token"] == 131072
    # 24 GiB - 2 x 8.03e9 weights: KV space over 128 KiB x 16 per block
    assert p["max_concurrency"] == p["num_blocks"] // 512
    bad = api.client.get("/api/v1/capacity", params={"model": "gpt-9"})
    assert bad.status_code == 422 and "model" in bad.text
    assert api.client.get("/api/v1/capacity", params={"utilization": 2}).status_code == 422
    custom = {
        "model": {
            "name": "mine",
            "params": 4 * 2**30,
            "layers": 32,
            "hidden": 4096,
            "heads": 32,
            "kv_heads": 8,
            "head_dim": 128,
        },
        "device": None,
        "memory_gib": 32,
        "utilization": 0.75,
        "context": 8192,
    }
    assert api.client.post("/api/v1/capacity", json=custom).status_code == 401
    c = api.client.post("/api/v1/capacity", json=custom, headers=api.h(api.run)).json()["plan"]
    assert c["max_concurrency"] == 16  # SPEC section 4: 16 GiB of KV for 16 x 8192 tokens
    assert len(api.client.get("/api/v1/presets/models").json()["items"]) >= 10
    assert api.client.get("/capacity?model=llama-3-70b&device=a100-80gb").status_code == 200
    page = api.client.get("/capacity?model=llama-3-8b&device=h100-sxm&context=8192")
    assert page.status_code == 200 and 'id="max-concurrency"' in page.text
    assert api.client.get("/capacity?utilization=abc").status_code == 422


def _finished_run(api: Api) -> str:
    spec = RunSpec(
        base_url="http://127.0.0.1:9", model="m", input_len=512, output_len=256, max_concurrency=16
    )
    with session_scope(api.sessions) as s:
        rid = repo.create_run(s, spec, source="bench", name="r16", status=RunStatus.SUCCEEDED)
        repo.update_run(
            s,
            rid,
            summary={"output_throughput_tok_s": 800.0, "ttft_ms_p50": 100.0, "tpot_ms_p50": 20.0},
        )
    return rid


def test_annotation_and_roofline_operating_points(api: Api) -> None:
    rid = _finished_run(api)
    r = api.client.put(
        f"/api/v1/runs/{rid}/annotation",
        json={"model": "llama-3-8b", "device": "h100-sxm"},
        headers=api.h(api.run),
    )
    assert r.status_code == 200, r.text
    assert r.json()["model"]["name"] == "llama-3-8b"
    bad = api.client.put(
        f"/api/v1/runs/{rid}/annotation", json={"model": "nope"}, headers=api.h(api.run)
    )
    assert bad.status_code == 422 and "model" in bad.text
    assert (
        api.client.put(
            "/api/v1/runs/zz/annotation", json={"model": "llama-3-8b"}, headers=api.h(api.run)
        ).status_code
        == 404
    )
    page = api.client.get("/roofline")
    assert page.status_code == 200
    assert "r16" in page.text and "decode at batch 16" in page.text
    assert "MFU" in page.text
    adhoc = api.client.get(f"/roofline?run={rid}&model=mistral-7b&preset=a100-80gb")
    assert adhoc.status_code == 200 and "decode at batch 16" in adhoc.text
    assert api.client.get("/roofline?run=nope&model=mistral-7b").status_code == 404
    assert api.client.get("/throughput").status_code == 200
    assert api.client.get(f"/throughput?run={rid}").status_code == 200
    assert api.client.get("/probes").status_code == 200
