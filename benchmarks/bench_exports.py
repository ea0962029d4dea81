"""Exports of a big run: throughput and the server's memory while one streams.

    python benchmarks/bench_exports.py [--requests 10000] [--tokens 1000]
        [--out benchmarks/results/exports.json]

Stores a synthetic run (``requests`` x ``tokens`` events, as bench_storage.py) in a SQLite
file, starts ``tokentrace serve`` on it (no embedded worker), downloads each export through
the REST API while sampling the server's resident memory every 50 ms, and reports bytes,
seconds, MB/s and the server's RSS growth over its idle RSS (targets: >= 50 MB/s, growth
<= 300 MB, issue 14).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_storage import synthetic_records

from app.client.spec import RunSpec
from app.storage import repository as repo
from app.storage.db import make_engine, session_factory, session_scope, upgrade_database

ROOT = Path(__file__).resolve().parents[1]
WHAT = ("requests.csv", "requests.parquet", "events.csv", "events.jsonl", "events.parquet")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def seed(url: str, n: int, tokens: int) -> str:
    upgrade_database(url)
    engine = make_engine(url)
    sessions = session_factory(engine)
    step = 1000
    with session_scope(sessions) as s:
        run_id = repo.create_run(s, RunSpec(base_url="http://h:1", model="m"), source="bench")
    for start in range(0, n, step):  # a slice at a time: the seeding stays small too
        recs = synthetic_records(min(step, n - start), tokens, seed=start)
        for i, r in enumerate(recs):
            r.index = start + i
        with session_scope(sessions) as s:
            repo.insert_requests(s, run_id, recs)
    with session_scope(sessions) as s:
        stored = repo.count_requests(s, run_id)
    engine.dispose()
    if stored != n:
        raise SystemExit(f"seeding stored {stored} of {n} requests")
    return run_id


def download(url: str, pid: int) -> dict[str, Any]:
    peak = [0.0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss_mb(pid))
            time.sleep(0.05)

    t = threading.Thread(target=sample, daemon=True)
    base = rss_mb(pid)
    t.start()
    n = 0
    t0 = time.monotonic()
    # as a download tool asks (curl, a browser saving a file): the bytes as they are
    with httpx.stream("GET", url, timeout=600, headers={"Accept-Encoding": "identity"}) as r:
        r.raise_for_status()
        for chunk in r.iter_raw():
            n += len(chunk)
    dt = time.monotonic() - t0
    done.set()
    t.join()
    return {
        "bytes": n,
        "seconds": round(dt, 2),
        "mb_per_s": round(n / 1e6 / dt, 1),
        "server_rss_before_mb": round(base, 1),
        "server_rss_peak_mb": round(peak[0], 1),
        "server_rss_growth_mb": round(peak[0] - base, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--tokens", type=int, default=1_000)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "exports.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tt-exp-") as d:
        url = f"sqlite:///{Path(d) / 'exp.db'}"
        t0 = time.monotonic()
        run_id = seed(url, args.requests, args.tokens)
        seeded_s = time.monotonic() - t0
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENTRACE_")}
        env |= {"TOKENTRACE_DATABASE_URL": url, "TOKENTRACE_PORT": str(port),
                "TOKENTRACE_LOCAL_WORKER": "false", "PYTHONPATH": str(ROOT)}  # fmt: skip
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli.main", "serve", "--log-level", "warning"],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            base = f"http://127.0.0.1:{port}"
            for _ in range(200):
                try:
                    if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            out: dict[str, Any] = {
                "requests": args.requests,
                "tokens_per_request": args.tokens,
                "events": args.requests * args.tokens,
                "seed_s": round(seeded_s, 1),
                "exports": {},
            }
            for what in WHAT:
                res = download(f"{base}/api/v1/runs/{run_id}/export/{what}", proc.pid)
                out["exports"][what] = res
                print(what, res, flush=True)
        finally:
            proc.terminate()
            proc.wait(30)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
