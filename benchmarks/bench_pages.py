"""Page benchmark: server time to render the run page of a 1M-event run, and what the browser
downloads; then the run page of a 10M-event run served by ``tokentrace serve``.

    python benchmarks/bench_pages.py [--requests 2050] [--tokens 500] [--repeat 7]
        [--serve-requests 10000] [--serve-tokens 1000] [--no-serve]
        [--out benchmarks/results/pages.json]

Builds a run of ``requests`` x ``tokens`` events (1 token per event, ~10 ms gaps with jitter,
2% errors) directly through the storage layer in a temporary SQLite file, finalizes it
(``finalize_run`` stores the run page's summary), then renders ``GET /runs/{id}`` through the
app (TestClient, no network) ``repeat`` times and reports the median and max wall time (each
render reads the stored summary and the per-request values: no event is decoded). Also:
the request page of one request, the runs page, and the bytes a first visit downloads
(HTML with its embedded figure JSON; CSS/JS; plotly.min.js reported apart as it is cached
after the first visit), raw and gzip-compressed.

The served case (key ``serve_10m``, issue 14 item 3): seeds ``serve-requests`` x
``serve-tokens`` events (bench_exports.py's seeding) in a temporary SQLite file, finalizes
the run in a child process as a job's completion does (``finalize_run``: one decode of the
events, the page summary stored; its wall time and peak RSS reported), starts ``tokentrace
serve`` on the file and renders the run page (plain, SLO edit, vLLM profile) ``repeat``
times while sampling the server's RSS every 20 ms (targets: <= 1 s warm, <= 200 MB RSS
growth). Last, the same page once after deleting the stored summary: the first view of a
run finalized before summaries existed, which computes and stores it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_exports import free_port, rss_mb
from bench_exports import seed as seed_big
from fastapi.testclient import TestClient

from app.analysis.metrics import per_request_metrics
from app.api.app import create_app
from app.client.spec import RunSpec
from app.domain import EventKind, RequestRecord, RequestStatus, RunStatus, trace_from_records
from app.services.runs import finalize_run, open_database
from app.settings import Settings
from app.storage import repository as repo
from app.storage import summaries as summary_repo
from app.storage.db import make_engine, session_factory, session_scope

TARGET_S = 1.0
SERVE_TARGET_S = 1.0
SERVE_TARGET_RSS_MB = 200.0
ROOT = Path(__file__).resolve().parents[1]


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
    finalize_run(sessions, run_id, status=RunStatus.SUCCEEDED, meta=None)  # stores its summary
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


def finalize_child(url: str, run_id: str) -> None:
    """(child process) Finalize the run as a job's completion does; print time and RSS."""
    engine = make_engine(url)
    sessions = session_factory(engine)
    before = rss_mb(os.getpid())
    t0 = time.perf_counter()
    finalize_run(sessions, run_id, status=RunStatus.SUCCEEDED, meta=None)
    took = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
    engine.dispose()
    print(
        json.dumps(
            {
                "seconds": round(took, 2),
                "rss_before_mb": round(before, 1),
                "peak_rss_mb": round(peak, 1),
                "peak_rss_growth_mb": round(peak - before, 1),
            }
        )
    )


class RssSampler:
    """The peak RSS of a process, sampled every 20 ms while in a ``with`` block."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, rss_mb(self.pid))
            time.sleep(0.02)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb(self.pid))


def _get(url: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    r = httpx.get(url, timeout=600)
    took = time.perf_counter() - t0
    if r.status_code != 200:
        raise SystemExit(f"GET {url}: HTTP {r.status_code}: {r.text[:300]}")
    return took, len(r.content)


def serve_case(n_req: int, n_tok: int, repeat: int) -> dict[str, Any]:
    """The 10M-event case: finalize, then the run page through ``tokentrace serve``."""
    with tempfile.TemporaryDirectory(prefix="tt-pages-") as d:
        url = f"sqlite:///{Path(d) / 'pages.db'}"
        t0 = time.perf_counter()
        run_id = seed_big(url, n_req, n_tok)
        seed_s = time.perf_counter() - t0
        print(f"seeded {n_req} x {n_tok} events in {seed_s:.0f} s; finalizing", flush=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENTRACE_")}
        env["PYTHONPATH"] = str(ROOT)
        child = subprocess.run(
            [sys.executable, __file__, "--finalize", url, run_id],
            env=env, cwd=ROOT, check=True, capture_output=True, text=True,
        )  # fmt: skip
        finalize = json.loads(child.stdout.strip().splitlines()[-1])
        print("finalize", finalize, flush=True)
        port = free_port()
        env |= {"TOKENTRACE_DATABASE_URL": url, "TOKENTRACE_PORT": str(port),
                "TOKENTRACE_LOCAL_WORKER": "false"}  # fmt: skip
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli.main", "serve", "--log-level", "warning"],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            base = f"http://127.0.0.1:{port}"
            for _ in range(300):
                try:
                    if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            page = f"{base}/runs/{run_id}"
            _get(base + "/")  # imports and templates warm; not the run page
            idle = rss_mb(proc.pid)
            out: dict[str, Any] = {
                "requests": n_req,
                "tokens_per_request": n_tok,
                "events": n_req * n_tok,
                "seed_s": round(seed_s, 1),
                "finalize": finalize,
                "server_rss_idle_mb": round(idle, 1),
            }
            with RssSampler(proc.pid) as rss:
                first, html_bytes = _get(page)
                cases: dict[str, list[float]] = {"run_page": [], "slo_edit": [], "profile_vllm": []}
                for _ in range(repeat):
                    cases["run_page"].append(_get(page)[0])
                    cases["slo_edit"].append(_get(page + "?slo=1&slo_ttft=80")[0])
                    cases["profile_vllm"].append(_get(page + "?profile=vllm")[0])
            out["first_view_s"] = round(first, 3)
            for key, ts in cases.items():
                out[key] = {"median_s": round(statistics.median(ts), 3),
                            "max_s": round(max(ts), 3), "n": len(ts)}  # fmt: skip
            out["run_page_html_bytes"] = html_bytes
            out["server_rss_peak_mb"] = round(rss.peak, 1)
            out["server_rss_growth_mb"] = round(rss.peak - idle, 1)
            out["within_target"] = (
                out["run_page"]["median_s"] <= SERVE_TARGET_S
                and out["server_rss_growth_mb"] <= SERVE_TARGET_RSS_MB
            )
            engine = make_engine(url)
            with session_scope(session_factory(engine)) as s:
                summary_repo.delete_summary(s, run_id)
            engine.dispose()
            before = rss_mb(proc.pid)
            with RssSampler(proc.pid) as rss:
                lazy, _ = _get(page)
            out["no_summary_first_view"] = {
                "seconds": round(lazy, 2),
                "server_rss_growth_mb": round(rss.peak - before, 1),
                "then_warm_s": round(_get(page)[0], 3),
            }
        finally:
            proc.terminate()
            proc.wait(30)
    return out


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--finalize":
        finalize_child(sys.argv[2], sys.argv[3])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2050)  # ~1.0M events (2% fail)
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--serve-requests", type=int, default=10_000)
    ap.add_argument("--serve-tokens", type=int, default=1_000)
    ap.add_argument("--no-serve", action="store_true", help="skip the 10M-event served case")
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
        app = create_app(
            Settings(database_url=url, local_worker=False, allowed_hosts=["testserver"])
        )
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
    if not args.no_serve:
        result["serve_10m"] = serve_case(args.serve_requests, args.serve_tokens, args.repeat)
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
    big = result.get("serve_10m")
    if big:
        print(
            f"served {big['events']:,} events: run page {big['run_page']['median_s']:.3f} s "
            f"warm (SLO edit {big['slo_edit']['median_s']:.3f} s, vLLM profile "
            f"{big['profile_vllm']['median_s']:.3f} s), server RSS +"
            f"{big['server_rss_growth_mb']:.0f} MB; finalize {big['finalize']['seconds']} s, "
            f"peak RSS {big['finalize']['peak_rss_mb']:.0f} MB; "
            f"{'met' if big['within_target'] else 'MISSED'}"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
