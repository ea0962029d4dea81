"""API load benchmark: N dashboard readers and M uploading workers against one live server.

    python benchmarks/bench_api_load.py [--readers 8] [--uploaders 2] [--duration 10]
        [--batch 50] [--database-url URL] [--out benchmarks/results/api_load.json]

Starts ``tokentrace serve`` as a subprocess on loopback (a fresh SQLite file unless
``--database-url`` is given) with no embedded worker. Seeds a few finished runs, then for
``duration`` seconds:

- each of the ``readers`` threads loops over GET /api/v1/runs, GET /api/v1/runs/{id}, GET /
  (runs page) and GET /runs/{id} (run page) of a seeded run;
- each of the ``uploaders`` threads is a worker: registers, queues a run, leases it and posts
  numbered result batches of ``batch`` requests as fast as the server acknowledges them
  (every batch carries real packed events: 16 tokens per request), then completes the job.

Reports per route: requests, throughput (req/s), p50/p99/max latency (ms) and non-2xx count;
and checks that every uploaded request was stored exactly once. Bounded in time and count;
loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.protocol.wire import WireRequest  # noqa: E402
from app.services import auth  # noqa: E402
from app.services.runs import open_database  # noqa: E402
from app.storage.db import session_scope, upgrade_database  # noqa: E402
from tests.api_support import CAPS, record  # noqa: E402
from tests.live_server import free_port  # noqa: E402


@dataclass
class Stats:
    lat_ms: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, route: str, ms: float, ok: bool) -> None:
        with self.lock:
            self.lat_ms.setdefault(route, []).append(ms)
            if not ok:
                self.errors[route] = self.errors.get(route, 0) + 1


def timed(stats: Stats, route: str, fn: Any, *args: Any, **kw: Any) -> httpx.Response | None:
    t = time.perf_counter()
    try:
        r: httpx.Response = fn(*args, **kw)
    except httpx.HTTPError:
        stats.add(route, (time.perf_counter() - t) * 1e3, False)
        return None
    stats.add(route, (time.perf_counter() - t) * 1e3, r.is_success)
    return r


def make_tokens(url: str) -> dict[str, str]:
    sessions = open_database(url)
    out = {}
    with session_scope(sessions) as s:
        for scope in ("admin", "worker"):
            _, out[scope] = auth.create_token(s, scopes=[scope], name=f"bench-{scope}")
    bind = sessions.kw.get("bind")
    if bind is not None:
        bind.dispose()
    return out


def start_server(
    url: str, port: int, log: Path, extra_env: dict[str, str]
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENTRACE_")}
    env.update(
        TOKENTRACE_DATABASE_URL=url,
        TOKENTRACE_HOST="127.0.0.1",
        TOKENTRACE_PORT=str(port),
        TOKENTRACE_LOCAL_WORKER="false",
        PYTHONPATH=str(ROOT),
        **extra_env,
    )
    cmd = [sys.executable, "-m", "app.cli.main", "serve", "--log-level", "warning"]
    with log.open("ab") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(log.read_text()[-3000:])


def batch_body(lease: str, no: int, start: int, n: int) -> bytes:
    reqs = [
        WireRequest.from_record(record(i, n_tokens=16)).model_dump(mode="json")
        for i in range(start, start + n)
    ]
    return json.dumps({"lease_id": lease, "batch_no": no, "requests": reqs}).encode()


def uploader(
    base: str,
    token: str,
    admin: str,
    stop: threading.Event,
    stats: Stats,
    batch: int,
    planned: int,
    done: dict[str, int],
) -> None:
    h = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base, timeout=60, trust_env=False) as c:
        spec = {
            "base_url": "http://127.0.0.1:9",
            "model": "bench",
            "num_prompts": planned,
            "output_len": 16,
            "input_len": 16,
        }
        r = c.post("/api/v1/runs", json=spec, headers={"Authorization": f"Bearer {admin}"})
        r.raise_for_status()
        caps = CAPS | {"labels": {}}
        wid = c.post(
            "/api/v1/workers/register",
            json={"name": f"bench-{secrets.token_hex(3)}", "capabilities": caps},
            headers=h,
        ).json()["worker_id"]
        job = None
        while job is None:  # each uploader queued one job, so each leases one
            job = c.post(f"/api/v1/workers/{wid}/lease", json={}, headers=h).json()["job"]
        lease, run_id, job_id = job["lease_id"], job["run_id"], job["job_id"]
        no, sent = 0, 0
        while not stop.is_set() and sent + batch <= planned:
            body = batch_body(lease, no, sent, batch)
            while True:  # retried until acknowledged, as the real worker does
                r = timed(
                    stats,
                    "POST results",
                    c.post,
                    f"/api/v1/jobs/{job_id}/results",
                    content=body,
                    headers=h | {"Content-Type": "application/json"},
                )
                if r is not None and r.is_success:
                    break
                time.sleep(0.05)
            no, sent = no + 1, sent + batch
            if no % 10 == 0:
                timed(
                    stats,
                    "POST heartbeat",
                    c.post,
                    f"/api/v1/jobs/{job_id}/heartbeat",
                    json={"lease_id": lease},
                    headers=h,
                )
        r = timed(
            stats,
            "POST complete",
            c.post,
            f"/api/v1/jobs/{job_id}/complete",
            json={"lease_id": lease, "status": "cancelled", "total_batches": no},
            headers=h,
        )
        with stats.lock:
            done[run_id] = sent


def reader(base: str, run_ids: list[str], stop: threading.Event, stats: Stats, k: int) -> None:
    with httpx.Client(base_url=base, timeout=60, trust_env=False) as c:
        i = k
        while not stop.is_set():
            rid = run_ids[i % len(run_ids)]
            timed(stats, "GET /api/v1/runs", c.get, "/api/v1/runs")
            timed(stats, "GET /api/v1/runs/{id}", c.get, f"/api/v1/runs/{rid}")
            timed(stats, "GET / (page)", c.get, "/")
            timed(stats, "GET /runs/{id} (page)", c.get, f"/runs/{rid}")
            i += 1


def seed(base: str, admin: str, worker: str, n_runs: int) -> list[str]:
    """Finished runs of 200 requests each, through the worker protocol."""
    stats, stop, done = Stats(), threading.Event(), {}  # type: dict[str, int]
    for _ in range(n_runs):
        uploader(base, worker, admin, stop, stats, 100, 200, done)
    return list(done)


def summarize(stats: Stats, seconds: float) -> dict[str, Any]:
    out = {}
    for route, lat in sorted(stats.lat_ms.items()):
        a = np.asarray(lat)
        out[route] = {
            "requests": int(a.size),
            "throughput_per_s": round(a.size / seconds, 1),
            "p50_ms": round(float(np.percentile(a, 50)), 2),
            "p99_ms": round(float(np.percentile(a, 99)), 2),
            "max_ms": round(float(a.max()), 2),
            "errors": stats.errors.get(route, 0),
        }
    return out


def stored_counts(base: str, run_ids: list[str]) -> dict[str, tuple[int, int]]:
    out = {}
    with httpx.Client(base_url=base, timeout=60, trust_env=False) as c:
        for rid in run_ids:
            idx: list[int] = []
            offset = 0
            while True:
                page = c.get(
                    f"/api/v1/runs/{rid}/requests", params={"limit": 5000, "offset": offset}
                ).json()
                idx += [row["index"] for row in page["items"]]
                offset += len(page["items"])
                if not page["items"] or offset >= page["total"]:
                    break
            out[rid] = (len(idx), len(set(idx)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--readers", type=int, default=8)
    ap.add_argument("--uploaders", type=int, default=2)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--database-url", default=None)
    ap.add_argument("--pool-size", type=int, default=None)
    ap.add_argument("--max-overflow", type=int, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/api_load.json")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tt-load-"))
    url = args.database_url or f"sqlite:///{tmp / 'load.db'}"
    upgrade_database(url)
    tokens = make_tokens(url)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {}
    if args.pool_size is not None:
        env["TOKENTRACE_DB_POOL_SIZE"] = str(args.pool_size)
    if args.max_overflow is not None:
        env["TOKENTRACE_DB_MAX_OVERFLOW"] = str(args.max_overflow)
    proc = start_server(url, port, tmp / "server.log", env)
    try:
        seeded = seed(base, tokens["admin"], tokens["worker"], 3)
        stats, stop, done = Stats(), threading.Event(), {}  # type: dict[str, int]
        planned = 1_000_000  # never reached: uploaders stop at the deadline
        threads = [
            threading.Thread(
                target=uploader,
                args=(
                    base,
                    tokens["worker"],
                    tokens["admin"],
                    stop,
                    stats,
                    args.batch,
                    planned,
                    done,
                ),
            )
            for _ in range(args.uploaders)
        ] + [
            threading.Thread(target=reader, args=(base, seeded, stop, stats, k))
            for k in range(args.readers)
        ]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        time.sleep(args.duration)
        stop.set()
        for t in threads:
            t.join(120)
        seconds = time.monotonic() - t0
        counts = stored_counts(base, list(done))
    finally:
        proc.terminate()
        proc.wait(20)
    lost = {rid: (done[rid], counts[rid]) for rid in done if counts[rid] != (done[rid],) * 2}
    result = {
        "benchmark": "api_load",
        "database": url.split(":", 1)[0],
        "readers": args.readers,
        "uploaders": args.uploaders,
        "batch_requests": args.batch,
        "duration_s": round(seconds, 2),
        "pool": {"size": args.pool_size or 10, "max_overflow": args.max_overflow or 70},
        "uploaded_requests": sum(done.values()),
        "stored_requests": sum(c[0] for c in counts.values()),
        "lost_or_duplicated_runs": lost,
        "page_errors": sum(stats.errors.values()),
        "routes": summarize(stats, seconds),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    if lost or result["page_errors"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
