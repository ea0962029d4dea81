"""Sweeps on workers (job kind ``sweep``) against the real server and the simulator: end to
end with every step, early stop at saturation, cancel mid-sweep, the step protocol's
idempotency; and the roofline note and hardware in the comparability key."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.analysis import roofline as rl
from app.analysis.comparability import check
from app.analysis.model_presets import ModelConfig
from app.domain import RunSpec
from app.loadgen.sim_config import SimConfig
from app.loadgen.simulator import SimulatorThread, start_simulator_thread
from app.services import compare as compare_svc
from app.services import hardware
from app.services import probes as probe_svc
from app.services import sweeps as sweep_svc
from app.services.runs import open_database
from app.settings import Settings
from app.storage import repository as repo
from app.storage.db import session_scope
from app.storage.models_probes import RunAnnotation
from app.wire import GPUInfo, RegisterRequest, WireRequest, WorkerCapabilities
from app.worker.job import JobOutcome
from app.worker.loop import Worker, WorkerOptions
from tests.live_server import LiveServer, LiveServerFactory, live_server  # noqa: F401
from tests.web_support import bench
from tests.worker_helpers import api, request_indices, sim_spec, wait_for, wait_job

pytestmark = pytest.mark.timeout(90)

FAST = WorkerOptions(
    backoff_initial_s=0.05,
    backoff_max_s=0.5,
    batch_interval_s=0.2,
    batch_max_requests=8,
    shutdown_grace_s=3.0,
    heartbeat_interval_s=0.2,
    poll_interval_s=0.1,
)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorThread]:
    # per-token time grows 3 ms per active stream: a few tens of req/s saturate it
    s = start_simulator_thread(
        SimConfig(ttft_ms=5, itl_ms=1.0, itl_per_active_ms=3.0, output_len=4, seed=4)
    )
    yield s
    s.stop()


def make_worker(srv: LiveServer, tmp_path: Path, name: str = "w") -> Worker:
    return Worker(
        srv.url, srv.worker_token, state_dir=tmp_path / f"state-{name}", name=name, options=FAST
    )


def sweep_body(sim: SimulatorThread, **kw: Any) -> dict[str, Any]:
    base = sim_spec(sim.base_url, num_prompts=12, output_len=4, arrival="constant")
    base.pop("max_concurrency")
    return base | kw


def create(c: Any, body: dict[str, Any]) -> tuple[str, str]:
    r = c.post("/sweeps", json=body)
    assert r.status_code == 201, r.text
    return r.json()["sweep_id"], r.json()["job_id"]


def test_sweep_job_end_to_end(
    live_server: LiveServerFactory,  # noqa: F811
    db_url: str,
    sim: SimulatorThread,
    tmp_path: Path,
) -> None:
    srv = live_server(db_url)
    with api(srv) as c:
        sweep_id, job_id = create(c, sweep_body(sim, rates=[4, 8], name="sw", tags=["t1"]))
        assert c.get(f"/jobs/{job_id}").json()["kind"] == "sweep"
        assert c.get(f"/sweeps/{sweep_id}").json()["status"] == "queued"
        outcome = asyncio.run(make_worker(srv, tmp_path).run_once())
        assert outcome is not None and outcome.status == "succeeded", outcome
        j = wait_job(c, job_id, ("succeeded",), 10)
        assert "api_key" not in j["spec"]
        summary = c.get(f"/sweeps/{sweep_id}").json()
        assert summary["status"] == "succeeded" and summary["stop_reason"] is None
        assert [s["load"] for s in summary["steps"]] == [4.0, 8.0]
        assert all(s["status"] == "succeeded" for s in summary["steps"])
        for s in summary["steps"]:
            assert sorted(request_indices(c, s["run_id"])) == list(range(12))
            run = c.get(f"/runs/{s['run_id']}").json()
            assert run["run"]["tags"] == ["t1"] and run["run"]["name"].startswith("sw · ")
            worker = run["report"]["load"]["worker"]  # who ran it, for the hardware key
            assert worker["hostname"] and worker["gpus"] == []
        page = httpx_get(srv, f"/sweeps/{sweep_id}")
        assert 'id="steps-table"' in page
        assert all(s["run_id"] in page for s in summary["steps"])


def httpx_get(srv: LiveServer, path: str) -> str:
    import httpx

    r = httpx.get(
        srv.url + path, headers={"Authorization": f"Bearer {srv.admin_token}"}, trust_env=False
    )
    assert r.status_code == 200, r.text
    return r.text


@pytest.fixture
def server(live_server: LiveServerFactory, sqlite_url: str) -> LiveServer:  # noqa: F811
    return live_server(sqlite_url)


def test_sweep_job_stops_early_at_saturation(
    server: LiveServer, sim: SimulatorThread, tmp_path: Path
) -> None:
    with api(server) as c:
        sweep_id, _ = create(c, sweep_body(sim, num_prompts=20, rates=[10, 300, 600]))
        outcome = asyncio.run(make_worker(server, tmp_path).run_once())
        assert outcome is not None and outcome.status == "succeeded", outcome
        summary = c.get(f"/sweeps/{sweep_id}").json()
    assert [s["load"] for s in summary["steps"]] == [10.0, 300.0]  # 600 never ran
    assert summary["stop_reason"].startswith("stopped early: achieved")
    assert "saturated" in summary["stop_reason"]


def test_sweep_job_validation(server: LiveServer, sim: SimulatorThread) -> None:
    with api(server) as c:
        r = c.post("/sweeps", json=sweep_body(sim, rates=[8, 4]))
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "rates"]
        r = c.post("/sweeps", json=sweep_body(sim, rates=[4], auto=True))
        assert r.status_code == 422
        r = c.post("/sweeps", json=sweep_body(sim, concurrencies=[0, 2]))
        assert r.status_code == 422 and "concurrencies" in r.text
        r = c.post("/sweeps", json=sweep_body(sim, auto=True, auto_steps=0))
        assert r.status_code == 422 and "auto_steps" in r.text
        assert c.get("/sweeps").json() == []  # nothing was stored


def test_cancel_mid_sweep_keeps_finished_steps(
    server: LiveServer, sim: SimulatorThread, tmp_path: Path
) -> None:
    body = sweep_body(sim, num_prompts=40, rates=[20, 21, 22])
    box: dict[str, JobOutcome | None] = {}
    with api(server) as c:
        sweep_id, job_id = create(c, body)
        w = make_worker(server, tmp_path)
        t = threading.Thread(target=lambda: box.update(o=asyncio.run(w.run_once())))
        t.start()

        def second_step_running() -> bool:
            prog = c.get(f"/jobs/{job_id}").json().get("progress") or {}
            return bool(prog.get("step") == 1 and prog.get("steps") == 3)

        wait_for(second_step_running, 30, "step 2 of 3")
        r = c.post(f"/sweeps/{sweep_id}/cancel")
        assert r.status_code == 200 and r.json()["cancel_requested"], r.text
        t.join(30)
        assert not t.is_alive()
        assert box["o"] is not None and box["o"].status == "cancelled"
        wait_job(c, job_id, ("cancelled",), 10)
        summary = c.get(f"/sweeps/{sweep_id}").json()
        assert c.post(f"/sweeps/{sweep_id}/cancel").status_code == 409
    assert summary["status"] == "cancelled" and "cancelled" in summary["stop_reason"]
    steps = summary["steps"]
    assert len(steps) == 2  # the third never started
    assert steps[0]["status"] == "succeeded"
    assert steps[1]["status"] in ("partial", "cancelled")


def _register(c: Any, gpus: list[str] | None = None, token: str | None = None) -> str:
    caps = WorkerCapabilities(
        hostname="box",
        tokentrace_version="t",
        gpus=[GPUInfo(index=i, name=n) for i, n in enumerate(gpus or [])],
    )
    body = RegisterRequest(name="manual", capabilities=caps).model_dump(mode="json")
    r = c.post("/workers/register", json=body, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    wid: str = r.json()["worker_id"]
    return wid


def _wire(i: int, t0: int) -> dict[str, Any]:
    from app.domain import RequestRecord, RequestStatus

    rec = RequestRecord(
        index=i, scheduled_ns=t0, sent_ns=t0, end_ns=t0 + 5_000_000, status=RequestStatus.OK,
        input_tokens=4, output_tokens=1,
    )  # fmt: skip
    return WireRequest.from_record(rec).model_dump(mode="json")


def test_step_protocol_is_idempotent(
    live_server: LiveServerFactory,  # noqa: F811
    db_url: str,
    sim: SimulatorThread,
) -> None:
    srv = live_server(db_url)
    w = {"Authorization": f"Bearer {srv.worker_token}"}
    with api(srv) as c:
        sweep_id, job_id = create(c, sweep_body(sim, num_prompts=3, rates=[5, 6]))
        wid = _register(c, ["NVIDIA H100 80GB HBM3"], srv.worker_token)
        leased = c.post(f"/workers/{wid}/lease", json={"kinds": ["sweep"]}, headers=w).json()
        job = leased["job"]
        assert job["job_id"] == job_id and job["kind"] == "sweep" and job["run_id"] is None
        lease = job["lease_id"]
        step = {"lease_id": lease, "step_idx": 0, "load": 5, "load_kind": "rate"}
        first = c.post(f"/jobs/{job_id}/steps", json=step, headers=w)
        again = c.post(f"/jobs/{job_id}/steps", json=step, headers=w)
        assert first.status_code == 200 and again.json() == first.json()
        run_id = first.json()["run_id"]
        batch = {"lease_id": lease, "batch_no": 0, "run_id": run_id,
                 "requests": [_wire(i, 1_000_000 * (i + 1)) for i in range(3)]}  # fmt: skip
        a1 = c.post(f"/jobs/{job_id}/results", json=batch, headers=w).json()
        a2 = c.post(f"/jobs/{job_id}/results", json=batch, headers=w).json()
        assert (a1["accepted"], a1["duplicate"]) == (3, False)
        assert (a2["accepted"], a2["duplicate"]) == (0, True)
        assert sorted(request_indices(c, run_id)) == [0, 1, 2]  # nothing stored twice
        wrong = batch | {"batch_no": 1, "run_id": "nope"}
        bad = c.post(f"/jobs/{job_id}/results", json=wrong, headers=w)
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "run_id"]
        done = {"lease_id": lease, "status": "succeeded", "total_batches": 2}
        missing = c.post(f"/jobs/{job_id}/steps/0/complete", json=done, headers=w)
        assert missing.status_code == 409 and "batches missing: [1]" in missing.text
        done["total_batches"] = 1
        s1 = c.post(f"/jobs/{job_id}/steps/0/complete", json=done, headers=w)
        s2 = c.post(f"/jobs/{job_id}/steps/0/complete", json=done, headers=w)
        assert s1.status_code == 200 and s1.json()["status"] == "succeeded", s1.text
        assert s2.json()["summary"] == s1.json()["summary"]
        assert s1.json()["summary"]["load"] == 5.0
        end = {"lease_id": lease, "status": "succeeded", "total_batches": 1,
               "stop_reason": "stopped early: test"}  # fmt: skip
        r = c.post(f"/jobs/{job_id}/complete", json=end, headers=w)
        assert r.status_code == 200 and r.json()["state"] == "succeeded", r.text
        summary = c.get(f"/sweeps/{sweep_id}").json()
        assert summary["status"] == "succeeded" and summary["stop_reason"] == "stopped early: test"
        assert len(summary["steps"]) == 1
        run = c.get(f"/runs/{run_id}").json()
        assert run["report"]["load"]["worker"]["gpus"] == ["NVIDIA H100 80GB HBM3"]
        late = c.post(f"/jobs/{job_id}/steps", json=step | {"step_idx": 1}, headers=w)
        assert late.status_code == 409  # the lease is over


def test_lost_sweep_lease_keeps_steps_and_marks_partial(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    sim: SimulatorThread,
) -> None:
    srv = live_server(sqlite_url, env={"TOKENTRACE_LEASE_TTL_S": "1"})
    w = {"Authorization": f"Bearer {srv.worker_token}"}
    with api(srv) as c:
        sweep_id, job_id = create(c, sweep_body(sim, num_prompts=3, rates=[5, 6]))
        wid = _register(c, None, srv.worker_token)
        lease = c.post(f"/workers/{wid}/lease", json={"kinds": ["sweep"]}, headers=w).json()
        lease_id = lease["job"]["lease_id"]
        step = {"lease_id": lease_id, "step_idx": 0, "load": 5, "load_kind": "rate"}
        run_id = c.post(f"/jobs/{job_id}/steps", json=step, headers=w).json()["run_id"]
        batch = {"lease_id": lease_id, "batch_no": 0, "run_id": run_id,
                 "requests": [_wire(0, 1_000_000)]}  # fmt: skip
        assert c.post(f"/jobs/{job_id}/results", json=batch, headers=w).status_code == 200

        def expired() -> bool:  # a lease call sweeps expired leases
            c.post(f"/workers/{wid}/lease", json={"kinds": ["bench"]}, headers=w)
            return bool(c.get(f"/jobs/{job_id}").json()["state"] == "failed")

        wait_for(expired, 15, "the lease to expire", poll_s=0.3)
        summary = c.get(f"/sweeps/{sweep_id}").json()
        assert summary["status"] == "partial" and "worker lost" in summary["stop_reason"]
        assert [s["status"] for s in summary["steps"]] == ["partial"]
        assert request_indices(c, run_id) == [0]


# ---------------------------------------------------------------- roofline and hardware

# an MoE model: its weight-read floor is active params x 2 bytes / bandwidth
H100_BW = 3.35e12


def _model(floor_ms: float) -> dict[str, Any]:
    active = int(floor_ms / 1e3 * H100_BW / 2)
    return ModelConfig(
        name="test-moe", params=active * 4, active_params=active, layers=4, hidden=64,
        heads=4, kv_heads=4, head_dim=16, intermediate=128, vocab=100,
    ).model_dump(mode="json")  # fmt: skip


def _annotate(url: str, run_id: str, floor_ms: float, device: str | None = "h100-sxm") -> None:
    with session_scope(open_database(url)) as s:
        ann = probe_svc.Annotation(
            model=ModelConfig.model_validate(_model(floor_ms)), device=device
        )
        probe_svc.annotate(s, run_id, ann)


def test_weight_read_floor() -> None:
    m = ModelConfig.model_validate(_model(20.0))
    assert rl.weight_read_floor_s(m, H100_BW) == pytest.approx(0.020, rel=1e-6)
    dense = ModelConfig(
        name="d", params=1, layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16,
        intermediate=128, vocab=0,
    )  # fmt: skip
    floor = rl.weight_read_floor_s(dense, 1e9)
    step = rl.step_cost(dense, "decode", batch=1, tokens=1).total
    assert floor == pytest.approx(step.bytes / 1e9)
    with pytest.raises(ValueError):
        rl.weight_read_floor_s(dense, 0)


@pytest.fixture(scope="module")
def annotated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Two runs with TPOT ~20 ms and a one-step local sweep."""
    tmp = tmp_path_factory.mktemp("roof")
    url = f"sqlite:///{tmp / 'roof.db'}"
    sessions = open_database(url)
    cfg = SimConfig(ttft_ms=5, itl_ms=20.0, output_len=6, seed=1)
    kw: dict[str, Any] = {"num_prompts": 6, "output_len": 6, "request_rate": 100.0}
    a = bench(sessions, cfg, "a", **kw)
    b = bench(sessions, cfg, "b", **kw)
    sim = start_simulator_thread(cfg)
    try:
        spec = RunSpec(base_url=sim.base_url, model="tokentrace-sim", input_len=16, **kw)
        out = sweep_svc.execute_sweep(
            spec, sweep_svc.SweepPlan("rates", (50.0,)), sessions=sessions, name="roof"
        )
    finally:
        sim.stop()
    step_run = out.summary["steps"][0]["run_id"]
    return {"url": url, "a": a, "b": b, "sweep": out.sweep_id, "step": step_run}


NOTE = "decode is memory-bound"


def test_roofline_note_fires_on_run_sweep_and_compare_pages(annotated: dict[str, str]) -> None:
    url = annotated["url"]
    sessions = open_database(url)
    plain = compare_svc.load_samples(sessions, annotated["a"])
    assert plain.weight_floor_ms is None
    assert not any(NOTE in n["text"] for n in compare_svc.run_diagnosis(plain))
    tpot = plain.report["metrics"]["tpot_ms"]["p50"]
    assert 19 < tpot < 26, tpot
    _annotate(url, annotated["a"], tpot * 0.97)  # within 10% of the floor: fires
    _annotate(url, annotated["b"], tpot / 3)  # far above the floor: must not fire
    _annotate(url, annotated["step"], tpot * 0.97)
    rs = compare_svc.load_samples(sessions, annotated["a"])
    assert rs.weight_floor_ms == pytest.approx(tpot * 0.97, rel=1e-3)
    notes = [n["text"] for n in compare_svc.run_diagnosis(rs)]
    assert any(NOTE in t and "H100" in t for t in notes), notes
    far = compare_svc.load_samples(sessions, annotated["b"])
    assert not any("weight-read floor" in n["text"] for n in compare_svc.run_diagnosis(far))
    with TestClient(create_app_for(url)) as c:
        assert NOTE in c.get(f"/runs/{annotated['a']}").text
        assert NOTE not in c.get(f"/runs/{annotated['b']}").text
        assert NOTE in c.get(f"/sweeps/{annotated['sweep']}").text
        page = c.get(f"/compare?ids={annotated['a']}&ids={annotated['b']}")
        assert page.status_code == 200 and NOTE in page.text
        api_sweep = c.get(f"/api/v1/sweeps/{annotated['sweep']}").json()
        assert api_sweep["diagnosis"][0]["rule"] == "decode-memory-bound"


def create_app_for(url: str) -> Any:
    from app.api.app import create_app

    return create_app(Settings(database_url=url, local_worker=False))


def test_roofline_floor_from_measured_ceilings_of_the_worker_gpu(
    annotated: dict[str, str],
) -> None:
    from app.storage import probes as probe_repo

    url = annotated["url"]
    _annotate(url, annotated["b"], 20.0, device=None)  # a model, no device
    gpu = "NVIDIA Test GPU"
    with session_scope(open_database(url)) as s:
        stats = {"worker": {"id": "w", "name": "w", "hostname": "h", "gpus": [gpu]}}
        assert hardware.roofline_floor(s, annotated["b"], stats)[0] is None  # no bandwidth
        probe = probe_repo.create_probe(s, kind="ceilings", device="cuda", params={})
        probe_repo.finish_probe(
            s, probe, status="succeeded", fingerprint={"device_name": gpu},
            result={"ceilings": {"bandwidth_bps": H100_BW / 2}}, telemetry=None, error=None,
        )  # fmt: skip
        floor, label = hardware.roofline_floor(s, annotated["b"], stats)
    assert floor == pytest.approx(40.0, rel=1e-3) and gpu in label


def test_hardware_difference_is_flagged(annotated: dict[str, str]) -> None:
    url = annotated["url"]
    sessions = open_database(url)
    h100 = {"worker": {"gpus": ["NVIDIA H100 80GB HBM3"]}}
    a100 = {"worker": {"gpus": ["NVIDIA A100-SXM4-80GB"]}}
    assert hardware.hardware_of(h100, None) == "h100-sxm"
    assert hardware.hardware_of({"worker": {"gpus": ["X", "Y"]}}, None) == "X + Y"
    assert hardware.hardware_of({}, None) is None
    assert hardware.hardware_of(a100, "h100-sxm") == "h100-sxm"  # the annotation wins
    _annotate(url, annotated["a"], 20.0, device="h100-sxm")
    _annotate(url, annotated["b"], 20.0, device="a100-80gb")
    out = compare_svc.compare_runs(sessions, annotated["a"], [annotated["b"]])
    comp = out["comparability"]
    diff = {d["field"]: d["values"] for d in comp["differing"]}
    assert diff["hardware"] == ["h100-sxm", "a100-80gb"]
    # without annotations, the GPUs of the workers that ran them decide
    with session_scope(sessions) as s:
        for rid, stats in ((annotated["a"], h100), (annotated["b"], a100)):
            row = s.get(RunAnnotation, rid)
            assert row is not None
            s.delete(row)
            run = repo.find_run(s, rid)
            assert run is not None
            repo.update_run(s, rid, load_stats=(run.load_stats or {}) | stats)
    out = compare_svc.compare_runs(sessions, annotated["a"], [annotated["b"]])
    diff = {d["field"]: d["values"] for d in out["comparability"]["differing"]}
    assert diff == {"hardware": ["h100-sxm", "a100-80gb"]}
    assert out["comparability"]["variable"] == "hardware"
    same = check([{"hardware": "h100-sxm"}, {"hardware": "h100-sxm"}])
    assert same.differing == []


def test_cli_sweep_server_on_the_embedded_worker(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    sim: SimulatorThread,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    from app.cli.main import main

    srv = live_server(sqlite_url, local_worker=True)  # `serve`'s own worker takes sweeps
    code = main(
        [
            "sweep", "--server", srv.url, "--token", srv.admin_token,
            "--base-url", sim.base_url, "--model", "tokentrace-sim", "--num-prompts", "6",
            "--input-len", "16", "--output-len", "4", "--concurrencies", "1", "2", "--json",
        ]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    summary = json.loads(out)
    assert summary["status"] == "succeeded" and summary["job_id"]
    assert [s["load"] for s in summary["steps"]] == [1.0, 2.0]
    assert [s["load_kind"] for s in summary["steps"]] == ["concurrency"] * 2
