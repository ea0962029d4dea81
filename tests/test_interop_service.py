"""Imports stored all or nothing, the CLI and API around them, exports, server metrics
scraped during runs (local and worker paths), tokentrace's own /metrics and /readyz, and the
Docker files."""

from __future__ import annotations

import csv
import io
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from sqlalchemy import func, select

from app.cli.main import build_parser, extra_handlers, main
from app.client.spec import RunSpec
from app.importers.common import ImportFormatError
from app.services.file_imports import import_path, import_text
from app.services.runs import execute_bench, open_database, run_report
from app.storage import compare_repo
from app.storage import interop as interop_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.storage.models import Run
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread
from tests.api_support import api_client
from tests.test_interop_import import FIX, vllm_object

ROOT = Path(__file__).resolve().parents[1]


def _count_runs(sessions: Any) -> int:
    with session_scope(sessions) as s:
        return int(s.scalar(select(func.count()).select_from(Run)) or 0)


def test_import_is_all_or_nothing_and_keeps_the_files_figures(db_url: str) -> None:
    sessions = open_database(db_url)
    good = json.dumps(vllm_object(request_rate=2.0))
    bad = json.dumps(vllm_object(ttfts=[0.1]))
    with pytest.raises(ImportFormatError, match="object 2"):
        import_text(sessions, "vllm", good + "\n" + bad, file_name="v.json")
    assert _count_runs(sessions) == 0
    ids = import_text(sessions, "vllm", good + "\n" + good, file_name="v.json")
    assert len(ids) == 2
    with session_scope(sessions) as s:
        info = interop_repo.get_import(s, ids[1])
        assert info is not None and info.group_index == 1 and info.profile == "vllm"
        assert interop_repo.group_runs(s, info.group_id) == ids
        run = repo.get_run(s, ids[0])
        assert f"import-group:{info.group_id}" in run.tags and run.source == "import:vllm"
        assert run.model == "meta/llama" and run.summary is not None
        assert info.figures["ttft"]["p50"] == pytest.approx(vllm_object()["median_ttft_ms"])
        assert repo.count_requests(s, ids[0]) == 5
    rep = run_report(sessions, ids[0], profile="vllm")
    assert rep["metrics"]["requests"]["failed"] == 1
    assert rep["profile"]["metrics"]["ttft"]["p50"] == pytest.approx(info.figures["ttft"]["p50"])


def test_cli_import_every_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    v = tmp_path / "vllm.json"
    v.write_text(json.dumps(vllm_object(detailed=False)))
    cases = [
        ("vllm", v, 1),
        ("guidellm", FIX / "guidellm-benchmarks.json", 2),
        ("aiperf", FIX / "aiperf" / "profile_export.jsonl", 1),
    ]
    for fmt, path, n in cases:
        assert main(["import", fmt, str(path), "--json", "--database-url", db]) == 0
        runs = json.loads(capsys.readouterr().out)["runs"]
        assert len(runs) == n, fmt
    # the AIPerf summary beside the JSONL was read too
    sessions = open_database(db)
    with session_scope(sessions) as s:
        info = interop_repo.get_import(s, runs[0])
    assert info is not None and info.tool == "AIPerf 0.13.0" and "ttft" in info.figures
    before = _count_runs(sessions)
    bad = tmp_path / "bad.jsonl"
    lines = (FIX / "aiperf" / "profile_export.jsonl").read_text().splitlines()
    bad.write_text("\n".join([*lines[:6], '{"metadata": {}}', *lines[6:]]))
    assert main(["import", "aiperf", str(bad), "--database-url", db]) == 2
    err = capsys.readouterr().err.strip()
    assert "line 7.metadata.request_start_ns" in err and len(err.splitlines()) == 1
    assert _count_runs(sessions) == before


def test_api_import_exports_and_run_page(db_url: str) -> None:
    with api_client(db_url) as api:
        files = {
            "file": (
                "profile_export.jsonl",
                (FIX / "aiperf" / "profile_export.jsonl").read_bytes(),
            ),
            "summary": (
                "profile_export_aiperf.json",
                (FIX / "aiperf" / "profile_export_aiperf.json").read_bytes(),
            ),
        }
        r = api.client.post("/api/v1/imports", data={"format": "aiperf"}, files=files)
        assert r.status_code == 401
        r = api.client.post(
            "/api/v1/imports", data={"format": "aiperf"}, files=files, headers=api.h(api.run)
        )
        assert r.status_code == 201, r.text
        (run_id,) = r.json()["runs"]
        bad = {"file": ("x.json", b'{"benchmarks": [{"metrics": 3}]}')}
        r = api.client.post(
            "/api/v1/imports", data={"format": "guidellm"}, files=bad, headers=api.h(api.run)
        )
        assert r.status_code == 422 and "benchmarks[0].metrics" in r.text
        r = api.client.post(
            "/api/v1/imports", data={"format": "nope"}, files=bad, headers=api.h(api.run)
        )
        assert r.status_code == 422 and "format" in r.text

        def get(what: str) -> bytes:
            resp = api.client.get(f"/api/v1/runs/{run_id}/export/{what}")
            assert resp.status_code == 200, (what, resp.text)
            return resp.content

        rows = json.loads(get("requests.json"))
        assert len(rows) == 12 and rows[0]["output_tokens"] == 16
        table = pq.read_table(io.BytesIO(get("requests.parquet")))
        assert table.num_rows == 12
        assert table.column("ttft_ms").to_pylist() == pytest.approx([x["ttft_ms"] for x in rows])
        events = list(csv.DictReader(io.StringIO(get("events.csv").decode())))
        assert len(events) == sum(x["n_events"] for x in rows)
        assert float(events[0]["since_sent_ms"]) == pytest.approx(rows[0]["ttft_ms"], abs=1e-6)
        ev_table = pq.read_table(io.BytesIO(get("events.parquet")))
        assert ev_table.num_rows == len(events)
        assert len(list(csv.reader(io.StringIO(get("requests.csv").decode())))) == 13
        summary = json.loads(get("summary.json"))
        assert summary["imported"]["tool"] == "AIPerf 0.13.0"
        assert summary["report"]["run_id"] == run_id
        assert api.client.get(f"/api/v1/runs/{run_id}/export/bad.xls").status_code == 422
        assert api.client.get("/api/v1/runs/nope/export/summary.json").status_code == 404
        assert api.client.get(f"/api/v1/runs/{run_id}/server-metrics").json() == []
        # the dashboard: the file's figures beside ours, downloads, the import page
        page = api.client.get(f"/runs/{run_id}").text
        assert 'id="import-table"' in page and "AIPerf 0.13.0" in page
        assert "+0.00%" in page  # we reproduce AIPerf's own numbers
        assert f"/runs/{run_id}/events.parquet" in page
        assert api.client.get(f"/runs/{run_id}/events.parquet").status_code == 200
        assert api.client.get("/runs/nope/summary.json").status_code == 404
        assert 'id="import-form"' in api.client.get("/import").text


def test_summary_only_import_page_says_so(sqlite_url: str) -> None:
    with api_client(sqlite_url) as api:
        ids = import_path(api.sessions, "guidellm", FIX / "guidellm-benchmarks.json")
        page = api.client.get(f"/runs/{ids[0]}").text
        assert "Summary-only run" in page and "compare them" in page
        assert "GuideLLM 0.8.1" in page
        # the file's benchmarks form one sweep, a step per benchmark at its stated load
        with session_scope(api.sessions) as s:
            sweep_id = compare_repo.sweep_ids_of_runs(s, ids)[ids[0]]
            steps = compare_repo.sweep_steps(s, sweep_id)
            assert [(st.run_id, st.load, st.load_kind) for st in steps] == [
                (ids[0], 1.0, "concurrency"),
                (ids[1], 2.0, "concurrency"),
            ]
        sweep_page = api.client.get(f"/sweeps/{sweep_id}")
        assert sweep_page.status_code == 200 and ids[1] in sweep_page.text


def test_server_metrics_scraped_during_a_local_run(tmp_path: Path) -> None:
    sessions = open_database(f"sqlite:///{tmp_path / 'm.db'}")
    sim = start_simulator_thread(SimConfig(ttft_ms=20, itl_ms=5, seed=1))
    try:
        spec = RunSpec(
            base_url=sim.base_url,
            model="tokentrace-sim",
            num_prompts=24,
            request_rate=16.0,
            input_len=16,
            output_len=20,
        )
        out = execute_bench(spec, sessions=sessions, name="scraped")
        missing = execute_bench(
            spec.model_copy(
                update={"num_prompts": 2, "metrics_url": sim.base_url + "/no-metrics-here"}
            ),
            sessions=sessions,
        )
        off = execute_bench(
            spec.model_copy(update={"num_prompts": 2, "scrape_metrics": False}), sessions=None
        )
    finally:
        sim.stop()
    status = out.report["load"]["server_metrics"]
    assert status["status"] == "ok" and status["scrapes"] >= 2
    assert "vllm:num_requests_running" in status["series"]
    assert missing.report["load"]["server_metrics"]["status"] == "no /metrics (HTTP 404)"
    assert off.report["load"]["server_metrics"]["status"].startswith("off")
    assert out.run_id is not None
    with session_scope(sessions) as s:
        series = interop_repo.load_server_metrics(s, out.run_id)
        assert interop_repo.load_server_metrics(s, missing.run_id or "") == []
    running = next(x for x in series if x.name == "vllm:num_requests_running")
    end_ns = out.report["load"]["end_ns"]
    assert len(running.t_ns) == status["scrapes"]
    assert all(-1e9 < t < end_ns + 3e9 for t in running.t_ns)  # the run's own time axis
    assert running.t_ns == sorted(running.t_ns)
    gen = next(x for x in series if x.name == "vllm:generation_tokens_total")
    assert gen.kind == "counter" and gen.values == sorted(gen.values)
    from app.figures.interop import server_metrics_figure

    with session_scope(sessions) as s:
        trace = repo.load_trace(s, out.run_id)
    fig = server_metrics_figure(series, trace, "ok")
    names = {t["name"] for t in fig["data"]}
    assert "client: in flight" in names and any("server running" in n for n in names)
    assert any(n.startswith("generation_tokens /s") for n in names)


def test_worker_completion_carries_server_metrics(db_url: str) -> None:
    with api_client(db_url) as api:
        created = api.create_run()
        wid = api.register()
        job = api.lease(wid)
        assert job is not None
        series = [
            {
                "name": "vllm:num_requests_running",
                "labels": {"model_name": "m"},
                "kind": "gauge",
                "t_ns": [0, 1_000_000_000],
                "values": [1.0, 3.0],
            }
        ]
        body = {
            "lease_id": job["lease_id"],
            "status": "succeeded",
            "total_batches": 0,
            "run_meta": {"load_stats": {"server_metrics": {"status": "ok", "scrapes": 2}}},
            "server_metrics": series,
        }
        r = api.post_job(job["job_id"], "complete", body)
        assert r.status_code == 200, r.text
        got = api.client.get(f"/api/v1/runs/{created['run_id']}/server-metrics").json()
        assert got == [
            {
                "name": "vllm:num_requests_running",
                "labels": {"model_name": "m"},
                "kind": "gauge",
                "t_ms": [0.0, 1000.0],
                "values": [1.0, 3.0],
            }
        ]
        assert api.post_job(job["job_id"], "complete", body).status_code == 200  # retry
        with session_scope(api.sessions) as s:
            assert interop_repo.count_server_samples(s, created["run_id"]) == 2


def test_own_metrics_and_readyz(sqlite_url: str, tmp_path: Path) -> None:
    with api_client(sqlite_url) as api:
        assert api.client.get("/readyz").json() == {"status": "ready"}
        api.create_run()
        api.client.get("/api/v1/runs")
        text = api.client.get("/metrics").text
        assert 'tokentrace_jobs{state="queued"} 1.0' in text
        assert 'tokentrace_workers{state="registered"} 0.0' in text
        assert "tokentrace_database_up 1.0" in text
        assert re.search(
            r'tokentrace_http_request_duration_seconds_count\{method="GET",route="/api/v1/runs",'
            r'status="200"\} 1\.0',
            text,
        )
        assert "tokentrace_ingest_batches_total 0.0" in text
    # a second app has its own registry: nothing carried over
    with api_client(f"sqlite:///{tmp_path / 'other.db'}") as other:
        text = other.client.get("/metrics").text
        assert 'route="/api/v1/runs"' not in text
        assert 'tokentrace_jobs{state="queued"} 0.0' in text


# --------------------------------------------------------------------------- Docker


def _tokentrace_args(cmd: list[str]) -> None:
    """The command parses as a tokentrace invocation (what the image's ENTRYPOINT runs)."""
    if cmd[0] == "sim":
        from app.targets.simulator.cli import main as sim_main

        assert callable(sim_main)
        return
    parser = build_parser()
    extra_handlers(parser)
    parser.parse_args(cmd)


def test_compose_file_and_dockerfile_agree() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) >= {"postgres", "web", "gpu-worker", "sim"}
    web = services["web"]
    assert web["build"]["target"] == "runtime"
    assert web["environment"]["TOKENTRACE_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert web["depends_on"]["postgres"]["condition"] == "service_healthy"
    gpu = services["gpu-worker"]
    assert gpu["profiles"] == ["gpu"] and gpu["build"]["target"] == "cuda-worker"
    (dev,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert dev["driver"] == "nvidia" and dev["capabilities"] == ["gpu"]
    assert services["sim"]["profiles"] == ["sim"]
    assert "profiles" not in web and "profiles" not in services["postgres"]
    for name in ("web", "gpu-worker", "sim"):
        _tokentrace_args(services[name]["command"])

    docker = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM \S+ AS (\S+)$", docker, re.M)
    assert stages == ["build", "runtime", "cuda-worker"]
    blocks = re.split(r"^FROM ", docker, flags=re.M)[1:]
    by_stage = {b.split()[2]: b for b in blocks}
    for stage in ("runtime", "cuda-worker"):
        users = re.findall(r"^USER (\S+)$", by_stage[stage], re.M)
        assert users and users[-1] not in ("root", "0"), stage
        assert re.search(r'^ENTRYPOINT \["tokentrace"\]$', by_stage[stage], re.M)
    cmds = {
        stage: json.loads(found[-1])
        for stage, block in by_stage.items()
        if (found := re.findall(r"^CMD (\[.*\])$", block, re.M))
    }
    assert cmds["runtime"] == web["command"]
    assert cmds["cuda-worker"] == gpu["command"]
    assert shlex.split("tokentrace " + " ".join(web["command"]))[1] == "serve"
