"""Issue 17 benchmark: what the browser's table and live-panel reads cost on a large run.

    python benchmarks/bench_run_tables.py [--requests 100000] [--repeat 5]
        [--out benchmarks/results/run_tables.json]

Builds one run of ``requests`` requests (2 events each; latencies random, 2% errors) in a
temporary SQLite file through the storage layer, then times through the app (TestClient,
no network), ``repeat`` times each, median and max:

- ``GET /runs/{id}/live.json`` (the live panel's poll: per-request columns, no events),
- ``GET /runs/{id}/requests?sort=ttft&dir=desc`` (a sorted page of 100, in SQL),
- ``GET /runs/{id}/requests?status=ok&ttft_min=..&sort=e2e`` (filtered and sorted),
- ``GET /runs/{id}/requests/{idx}?sort=ttft&dir=desc`` (a request page with its
  previous/next in that order: a window function over the run's rows).

Wall-clock figures depend on the machine and its load: read them as orders of magnitude.
"""

from __future__ import annotations

import argparse
import json
import os
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
from app.domain import EventKind, RequestRecord, RequestStatus, trace_from_records
from app.services.runs import open_database
from app.settings import Settings
from app.storage import repository as repo
from app.storage.db import session_scope


def build_records(n: int, seed: int = 0) -> list[RequestRecord]:
    rng = np.random.default_rng(seed)
    out: list[RequestRecord] = []
    for i in range(n):
        sent = i * 10_000_000
        if rng.random() < 0.02:
            out.append(
                RequestRecord(
                    index=i,
                    scheduled_ns=sent,
                    sent_ns=sent,
                    end_ns=sent + 5_000_000,
                    status=RequestStatus.ERROR,
                    error="HTTP 500: simulated",
                )
            )
            continue
        ttft = int(rng.uniform(40e6, 120e6))
        e2e = ttft + int(rng.uniform(100e6, 400e6))
        t = np.array([sent + ttft, sent + e2e], np.int64)
        out.append(
            RequestRecord(
                index=i,
                scheduled_ns=sent,
                sent_ns=sent,
                end_ns=sent + e2e,
                status=RequestStatus.OK,
                input_tokens=64,
                output_tokens=32,
                event_t_ns=t,
                event_bytes=np.array([100, 100], np.int32),
                event_kind=np.array([int(EventKind.CONTENT)] * 2, np.int8),
                event_tokens=np.array([16, 16], np.int32),
            )
        )
    return out


def timed(client: TestClient, url: str, repeat: int) -> dict[str, Any]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = client.get(url)
        times.append(time.perf_counter() - t0)
        assert r.status_code == 200, (url, r.status_code, r.text[:300])
    return {"url": url, "median_s": statistics.median(times), "max_s": max(times)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/run_tables.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'big.db'}"
        sessions = open_database(url)
        recs = build_records(args.requests)
        metrics = per_request_metrics(trace_from_records(recs))
        t0 = time.perf_counter()
        with session_scope(sessions) as s:
            run_id = repo.create_run(
                s, RunSpec(base_url="http://x.test", model="m", num_prompts=args.requests)
            )
            repo.insert_requests(s, run_id, recs, metrics)
        build_s = time.perf_counter() - t0
        base = f"/runs/{run_id}"
        mid = args.requests // 2
        settings = Settings(database_url=url, local_worker=False, allowed_hosts=["testserver"])
        with TestClient(create_app(settings)) as c:
            results = [
                timed(c, f"{base}/live.json", args.repeat),
                timed(c, f"{base}/requests?sort=ttft&dir=desc", args.repeat),
                timed(c, f"{base}/requests?status=ok&ttft_min=80&sort=e2e", args.repeat),
                timed(c, f"{base}/requests/{mid}?sort=ttft&dir=desc", args.repeat),
            ]
    out = {
        "requests": args.requests,
        "repeat": args.repeat,
        "store_s": build_s,
        "results": results,
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_1m": os.getloadavg()[0],  # other work on the machine meanwhile
        },
        "note": "wall-clock on a shared machine: orders of magnitude only",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for r in results:
        print(f"{r['median_s'] * 1000:8.1f} ms median  {r['max_s'] * 1000:8.1f} ms max  {r['url']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
