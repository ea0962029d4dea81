"""Page benchmark: server time to render the run page of a 1M-event run, and what the browser
downloads.

    python benchmarks/bench_pages.py [--requests 2050] [--tokens 500] [--repeat 7]
        [--out benchmarks/results/pages.json]

Builds a run of ``requests`` x ``tokens`` events (1 token per event, ~10 ms gaps with jitter,
2% errors) directly through the storage layer in a temporary SQLite file, then renders
``GET /runs/{id}`` through the app (TestClient, no network) ``repeat`` times and reports the
median and max wall time (each render re-reads the run and recomputes everything: there is
no cache). Also: the request page of one request, the runs page, and the bytes a first visit
downloads (HTML with its embedded figure JSON; CSS/JS; plotly.min.js reported apart as it is
cached after the first visit), raw and gzip-compressed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastapi.testclient import TestClient

from app.analysis.metrics import per_request_metrics
from app.api.app import create_app
from app.client.spec import RunSpec
from app.domain import EventKind, RequestRecord, RequestStatus, RunStatus, trace_from_records
from app.services.runs import headline, open_database, run_report
from app.settings import Settings
from app.storage import repository as repo
from app.storage.db import session_scope

TARGET_S = 1.0


def build_records(n_req: int, n_tok: int, seed: int = 0) -> list[RequestRecord]:
    rng = np.random.default_rng(seed)
    records: list[RequestRecord] = []
    sched = np.cumsum(rng.exponential(1 / 50.0, n_req)) * 1e9  # Poisson 50 req/s
    for i in range(n_req):
        s = int(sched[i])
        sent = s + int(rng.uniform(0.05e6, 0.5e6))
        if rng.random() < 0.02:
            records.append(
                RequestRecord(
                    index=i,
                    scheduled_ns=s,
                    sent_ns=sent,
                    end_ns=sent + 5_000_000,
                    status=RequestStatus.ERROR,
                    error="HTTP 500: simulated",
                    http_status=500,
                    input_tokens=256,
                )
            )
            continue
        ttft = int(rng.uniform(40e6, 120e6))
        gaps = np.maximum(rng.normal(10e6, 1e6, n_tok - 1), 1e5).astype(np.int64)
        t = sent + ttft + np.concatenate([[0], np.cumsum(gaps)])
        records.append(
            RequestRecord(
                index=i,
                scheduled_ns=s,
                sent_ns=sent,
                end_ns=int(t[-1]) + 1000,
                done_ns=int(t[-1]) + 500,
                status=RequestStatus.OK,
                input_tokens=int(rng.integers(128, 512)),
                output_tokens=n_tok,
                token_source="usage",
                event_t_ns=t.astype(np.int64),
                event_bytes=np.full(n_tok, 40, np.int32),
                event_kind=np.full(n_tok, EventKind.CONTENT, np.int8),
                event_tokens=np.ones(n_tok, np.int32),
            )
        )
    return records


def store(url: str, records: list[RequestRecord]) -> str:
    sessions = open_database(url)
    spec = RunSpec(
        base_url="http://127.0.0.1:9000",
        model="bench-model",
        num_prompts=len(records),
        request_rate=50.0,
        output_len=int(records[0].output_tokens or 1) if records else 1,
        goodput={"ttft": 100.0, "e2el": 6000.0},
        tags=["bench"],
    )
    prm = per_request_metrics(trace_from_records(records, include_warmup=True))
    with session_scope(sessions) as s:
        run_id = repo.create_run(s, spec, name="1M events", status=RunStatus.RUNNING)
        repo.insert_requests(s, run_id, records, prm)
    with session_scope(sessions) as s:
        repo.finish_run(s, run_id, status=RunStatus.SUCCEEDED, validity=[])
    report = run_report(sessions, run_id)
    with session_scope(sessions) as s:
        repo.finish_run(s, run_id, summary=headline(report))
    return run_id


def timed(client: TestClient, path: str, repeat: int) -> tuple[list[float], bytes]:
    times: list[float] = []
    body = b""
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = client.get(path)
        times.append(time.perf_counter() - t0)
        assert r.status_code == 200, (path, r.status_code, r.text[:500])
        body = r.content
    return times, body


def sizes(data: bytes) -> dict[str, int]:
    return {"bytes": len(data), "gzip_bytes": len(gzip.compress(data, 6))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2050)  # ~1.0M events (2% fail)
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/pages.json"))
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/pages.db"
        t0 = time.perf_counter()
        records = build_records(args.requests, args.tokens)
        n_events = sum(int(r.event_t_ns.shape[0]) for r in records)
        run_id = store(url, records)
        del records
        build_s = time.perf_counter() - t0
        app = create_app(Settings(database_url=url, local_worker=False))
        with TestClient(app) as client:
            client.get(f"/runs/{run_id}")  # warm-up: imports, template compilation
            run_times, html = timed(client, f"/runs/{run_id}", args.repeat)
            slo_times, _ = timed(client, f"/runs/{run_id}?slo=1&slo_ttft=80", args.repeat)
            prof_times, _ = timed(client, f"/runs/{run_id}?profile=vllm", max(3, args.repeat // 2))
            req_times, req_html = timed(client, f"/runs/{run_id}/requests/1", args.repeat)
            list_times, list_html = timed(client, "/", args.repeat)
            css = client.get("/static/style.css").content
            js = client.get("/static/app.js").content
            plotly = client.get("/static/plotly.min.js").content

    def stats(ts: list[float]) -> dict[str, float]:
        return {"median_s": statistics.median(ts), "max_s": max(ts), "n": len(ts)}

    figure_json = sum(
        len(m) for m in html.decode().split('type="application/json"')[1:]
    )  # rough: the embedded figure blocks
    result: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "requests": args.requests,
        "tokens_per_request": args.tokens,
        "events": n_events,
        "build_and_store_s": build_s,
        "target_s": TARGET_S,
        "run_page": stats(run_times),
        "run_page_slo_edit": stats(slo_times),
        "run_page_profile_vllm": stats(prof_times),
        "request_page": stats(req_times),
        "runs_page": stats(list_times),
        "download": {
            "run_page_html": sizes(html),
            "run_page_figure_json_approx_bytes": figure_json,
            "request_page_html": sizes(req_html),
            "runs_page_html": sizes(list_html),
            "css_js": sizes(css + js),
            "plotly_min_js_cached": sizes(plotly),
        },
        "within_target": statistics.median(run_times) <= TARGET_S,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    d = result["download"]
    print(f"run of {args.requests} requests x {args.tokens} tokens = {n_events:,} events")
    print(f"{'page':<28}{'median':>10}{'max':>10}")
    for key in (
        "run_page",
        "run_page_slo_edit",
        "run_page_profile_vllm",
        "request_page",
        "runs_page",
    ):
        print(
            f"{key:<28}{result[key]['median_s'] * 1e3:>8.0f}ms{result[key]['max_s'] * 1e3:>8.0f}ms"
        )
    print(f"{'download':<28}{'bytes':>12}{'gzip':>12}")
    for key in (
        "run_page_html",
        "request_page_html",
        "runs_page_html",
        "css_js",
        "plotly_min_js_cached",
    ):
        print(f"{key:<28}{d[key]['bytes']:>12,}{d[key]['gzip_bytes']:>12,}")
    print(f"target {TARGET_S:.1f} s: {'met' if result['within_target'] else 'MISSED'}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
