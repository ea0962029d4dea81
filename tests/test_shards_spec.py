"""``shards`` (issue 26, one run over K workers): a whole number from 1 to 256 in the run
spec, the REST launch, ``tokentrace bench --server ... --shards K`` and the launch form;
anything else is a 422 / exit 2 naming it, nothing stored. A local ``bench`` (no
``--server``) refuses K above 1; a sweep deals each of its steps over K workers."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import func, select

from app.cli.main import main
from app.cli.render import shard_line
from app.client.spec import RunSpec
from app.domain import RunStatus
from app.protocol.wire import RunMeta
from app.services.jobs import expire_lost_leases
from app.services.shard_merge import ShardEnd, merge_shards
from app.storage.models import Run
from app.web import launch_form
from tests.api_support import SPEC, Api, api_client, wire

pytestmark = pytest.mark.timeout(60)


def test_spec_takes_a_count_from_1_to_256() -> None:
    base = {"base_url": "http://127.0.0.1:9", "model": "m"}
    assert RunSpec.model_validate(base).shards == 1
    assert RunSpec.model_validate(base | {"shards": 256, "num_prompts": 256}).shards == 256
    assert RunSpec.model_validate(base | {"shards": "4"}).shards == 4
    for bad in (0, -1, 257, 1.5, "x", True):
        with pytest.raises(ValidationError, match="shards: a whole number from 1 to 256"):
            RunSpec.model_validate(base | {"shards": bad})
    with pytest.raises(ValidationError, match=r"reset_prefix_cache: runs on one worker only"):
        RunSpec.model_validate(base | {"shards": 2, "reset_prefix_cache": True})


def test_launch_form_has_the_field() -> None:
    assert "shards" in {f.name for f in launch_form.FIELDS}


@pytest.fixture
def api(sqlite_url: str) -> Iterator[Api]:
    with api_client(sqlite_url) as a:
        yield a


@pytest.mark.parametrize("value", [0, -2, 257, 1.5, "many"])
def test_api_refuses_bad_shards_with_422(api: Api, value: Any) -> None:
    for path in ("/api/v1/runs", "/api/v1/sweeps"):
        body = SPEC | {"shards": value} | ({"rates": [1.0]} if "sweeps" in path else {})
        r = api.client.post(path, json=body, headers=api.h(api.run))
        assert r.status_code == 422, (path, r.status_code, r.text[:300])
        assert r.json()["detail"][0]["loc"][-1] == "shards", r.text[:300]
    with api.sessions() as s:
        assert int(s.scalar(select(func.count()).select_from(Run)) or 0) == 0


def test_a_sharded_sweep_deals_each_step_over_k_leases(api: Api) -> None:
    """Was refused (422) before sharded sweeps; now its first step is one run of K leases
    (the rest: tests/test_shards_sweep.py). A bad count is still a 422 naming it."""
    body = SPEC | {"shards": 2, "rates": [1.0]}
    r = api.client.post("/api/v1/sweeps", json=body, headers=api.h(api.run))
    assert r.status_code == 201, r.text[:300]
    leases = [api.lease(api.register()) for _ in range(3)]
    assert leases[2] is None and [j["shard"] for j in leases[:2] if j] == [0, 1]
    bad = api.client.post("/api/v1/sweeps", json=body | {"shards": 0}, headers=api.h(api.run))
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][-1] == "shards"


@pytest.mark.parametrize("value", ["0", "-1", "257", "1.5", "x"])
def test_cli_refuses_bad_shards_with_exit_2(capsys: pytest.CaptureFixture[str], value: str) -> None:
    args = ["bench", "--model", "m", "--base-url", "http://127.0.0.1:9"]
    args += ["--server", "http://127.0.0.1:9", "--token", "t", f"--shards={value}"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--shards" in err[0], err


def test_cli_refuses_shards_without_a_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    args = ["bench", "--model", "m", "--base-url", "http://127.0.0.1:9", "--database-url", url]
    assert main([*args, "--shards", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--shards" in err[0] and "--server" in err[0], err


def test_a_sharded_run_is_k_leases_each_knowing_its_shard(api: Api) -> None:
    out = api.create_run(shards=2)
    leases = [api.lease(api.register()) for _ in range(3)]
    assert leases[2] is None  # two jobs, one run
    assert [j["shard"] for j in leases[:2] if j] == [0, 1]
    assert {j["run_id"] for j in leases[:2] if j} == {out["run_id"]}
    assert all(j and j["spec"]["shards"] == 2 for j in leases[:2])


def _meta() -> dict[str, Any]:
    return {"clock_source": "kernel", "load_stats": {"counts": {"planned": 3, "sent": 3}}}


def test_waiting_shards_are_said_and_cancel_stops_every_shard(api: Api) -> None:
    out = api.create_run(shards=2)
    rid = out["run_id"]
    job = api.lease(api.register())
    assert job is not None and job["shard"] == 0
    prog = api.client.get(f"/runs/{rid}/progress.json", headers=api.h(api.read)).json()
    assert prog["text"] == "1 of 2 shards leased (0 ready)"
    ready = api.post_job(job["job_id"], "shard-ready", {"lease_id": job["lease_id"]}).json()
    assert ready["start_ns"] is None and (ready["leased"], ready["ready"]) == (1, 1)
    r = api.client.delete(f"/api/v1/runs/{rid}", headers=api.h(api.run))
    assert r.status_code == 409, r.text  # a shard is on a worker
    r = api.client.post(f"/api/v1/runs/{rid}/cancel", headers=api.h(api.run))
    assert r.status_code == 200, r.text
    beat = api.post_job(job["job_id"], "heartbeat", {"lease_id": job["lease_id"]}).json()
    assert beat["cancel"] is True  # the leased shard stops; the queued one is cancelled
    assert api.lease(api.register()) is None
    done = {"lease_id": job["lease_id"], "status": "cancelled", "total_batches": 0}
    assert api.post_job(job["job_id"], "complete", done).status_code == 200
    run = api.client.get(f"/api/v1/runs/{rid}", headers=api.h(api.run)).json()["run"]
    assert run["status"] == "cancelled"


def test_a_lost_shard_leaves_the_run_partial_naming_it(api: Api) -> None:
    """Shard 1's worker is lost after the start (its lease expires): shard 0's requests
    are kept, the run is partial and its notes name shard 1 and count what it lost."""
    out = api.create_run(shards=2, num_prompts=6)
    rid = out["run_id"]
    jobs = [api.lease(api.register()) for _ in range(2)]
    assert all(jobs)
    for j in jobs:
        assert j is not None
        api.post_job(j["job_id"], "shard-ready", {"lease_id": j["lease_id"]})
    j0, j1 = jobs
    assert j0 is not None and j1 is not None
    start = api.post_job(j0["job_id"], "shard-ready", {"lease_id": j0["lease_id"]}).json()
    assert start["start_ns"] is not None  # both ready: one start for both
    # without a cap, request i goes to shard i mod 2: shard 0 sends 0, 2, 4; shard 1 1, 3, 5
    body = {"lease_id": j0["lease_id"], "batch_no": 0, "requests": wire([0, 2, 4])}
    assert api.post_job(j0["job_id"], "results", body).status_code == 200
    body = {"lease_id": j1["lease_id"], "batch_no": 0, "requests": wire([1])}
    assert api.post_job(j1["job_id"], "results", body).status_code == 200
    done = {"lease_id": j0["lease_id"], "status": "succeeded", "total_batches": 1,
            "records": 3, "run_meta": _meta()}  # fmt: skip
    assert api.post_job(j0["job_id"], "complete", done).status_code == 200
    assert api.client.get(f"/api/v1/runs/{rid}", headers=api.h(api.run)).json()["run"][
        "status"
    ] in ("queued", "running")  # shard 1 still holds its lease
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    expired = expire_lost_leases(api.sessions, now=later)
    assert [e.job_id for e in expired] == [j1["job_id"]]
    detail = api.client.get(f"/api/v1/runs/{rid}", headers=api.h(api.run)).json()
    assert detail["run"]["status"] == "partial"
    notes = detail["report"]["validity"]["notes"]
    assert any(n.startswith("shard 1 lost (worker lost") and "2 requests lost" in n for n in notes)
    rows = api.client.get(f"/api/v1/runs/{rid}/requests", headers=api.h(api.run)).json()
    assert {r["index"]: r["shard"] for r in rows["items"]} == {0: 0, 2: 0, 4: 0, 1: 1}
    shards = detail["report"]["load"]["shards"]
    assert [(s["shard"], s["state"], s.get("lost")) for s in shards] == [
        (0, "succeeded", None), (1, "failed", 2),
    ]  # fmt: skip


def test_a_clock_bound_over_5_ms_flags_its_shard() -> None:
    meta = RunMeta.model_validate(
        {"load_stats": {"shard": {"shard": 1, "clock": {"offset_ns": 3, "bound_ns": 6_000_000}}}}
    )
    ok = ShardEnd(0, "succeeded", None, RunStatus.SUCCEEDED, [], 0, None, 2, 2, "w0")
    far = ShardEnd(1, "succeeded", None, RunStatus.SUCCEEDED, [], 0, meta, 2, 2, "w1")
    status, notes, lost, merged = merge_shards([ok, far], {"num_prompts": 4, "shards": 2})
    assert status is RunStatus.SUCCEEDED and lost == 0 and merged is not None
    assert notes == [
        "shard 1: its worker's clock bound 6.0 ms exceeds 5 ms: its times against the other "
        "shards' are flagged"
    ]
    rows = merged.load_stats["shards"]
    assert [r["clock_flagged"] for r in rows] == [False, True] and rows[1]["clock_bound_ms"] == 6.0
    assert [r["planned"] for r in rows] == [2, 2]


def test_the_merged_run_has_the_worst_shards_client_health() -> None:
    """Loop lag, read delay and CPU wait as the worst shard had them (each quantile's
    largest, the samples of all), the CPU wait in all summed: by hand."""

    def meta(loop: tuple[int, float, float, float], wait_total: float) -> RunMeta:
        n, p50, p99, mx = loop
        lag = {"n": n, "p50_ms": p50, "p99_ms": p99, "max_ms": mx}
        return RunMeta.model_validate(
            {"load_stats": {"loop_lag_ms": lag, "cpu_wait_ms": {"n": 0, "p50_ms": None,
             "p99_ms": None, "max_ms": None}, "cpu_wait_total_ms": wait_total}}
        )  # fmt: skip

    a = ShardEnd(0, "succeeded", None, RunStatus.SUCCEEDED, [], 0,
                 meta((10, 0.2, 0.9, 1.5), 3.0), 2, 2, "w0")  # fmt: skip
    b = ShardEnd(1, "succeeded", None, RunStatus.SUCCEEDED, [], 0,
                 meta((30, 0.1, 12.5, 14.0), 4.5), 2, 2, "w1")  # fmt: skip
    _, _, _, merged = merge_shards([a, b], {"num_prompts": 4, "shards": 2})
    assert merged is not None
    stats = merged.load_stats
    assert stats["loop_lag_ms"] == {"n": 40, "p50_ms": 0.2, "p99_ms": 12.5, "max_ms": 14.0}
    assert stats["cpu_wait_total_ms"] == 7.5
    assert stats["cpu_wait_ms"]["n"] == 0  # no shard had samples: shard 0's kept as it was


def test_more_shards_than_requests_or_slots_is_refused() -> None:
    base = {"base_url": "http://127.0.0.1:9", "model": "m", "shards": 4}
    for extra in ({"num_prompts": 3}, {"max_concurrency": 2}):
        with pytest.raises(ValidationError, match=r"shards: 4 is more than the run's"):
            RunSpec.model_validate(base | extra)
    assert RunSpec.model_validate(base | {"num_prompts": 4, "max_concurrency": 4}).shards == 4


def test_the_cli_prints_one_line_per_shard() -> None:
    row = {
        "shard": 1,
        "ok": 7,
        "planned": 10,
        "tokens_per_s": 812.0,
        "send_lag_p99_ms": 0.31,
        "clock_bound_ms": 0.92,
        "start_skew_ms": 0.34,
        "lost": 3,
        "error": "worker lost",
    }
    assert shard_line(row) == (
        "shard 1: 7/10 ok, 812.0 tok/s, send lag p99 0.310 ms, clock bound 0.920 ms, "
        "start skew 0.340 ms, 3 lost (worker lost)"
    )
    more = row | {"lost": 0, "processes": 2, "warmup_end_ms": 171.58, "measure_start_ms": 572.4}
    assert shard_line(more) == (
        "shard 1: 7/10 ok, 812.0 tok/s, send lag p99 0.310 ms, clock bound 0.920 ms, "
        "start skew 0.340 ms, 2 load processes, warm-ups end 171.6 ms, measure start 572.4 ms"
    )
