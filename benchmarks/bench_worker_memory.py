"""A worker against a target that floods every way: its peak memory (issue 23, item 6).

    python benchmarks/bench_worker_memory.py [--streams 64] [--requests 128] [--mode mixed]
        [--time-limit 300] [--rss-limit-mb 4000] [--code-root PATH]
        [--out benchmarks/results/worker_memory.json]

Starts three processes on loopback: the flooding target (``tests/flood_target.py``; mode
``mixed``: chat requests get an endless stream, endless 8 MiB events and an endless stream
of tiny events in turn, while ``/metrics`` and ``/v1/models`` never end; ``streams``: the
same streams, the other two answering normally; ``valid60``: a valid 60 MB reply per
request), ``tokentrace serve`` (a
fresh SQLite file, no embedded worker) and ``tokentrace worker``. It submits one
run of ``requests`` requests at ``streams`` concurrency with the default client limits and
samples the worker's resident memory (VmRSS, as ``bench_exports.py`` does) every 50 ms
until the job ends. Reported: the worker's RSS before the job and its peak, the job's
state, the stored requests by status and reason, what the run says of the scrape and the
model list. ``--code-root`` runs the dashboard and the worker from another checkout (the
code before a change); a worker past ``--rss-limit-mb`` is killed and says so (the figure
then is "more than" that). Bounded in time (``--time-limit``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import live_server  # noqa: E402
from tests.live_server import LiveServer, free_port  # noqa: E402


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def start_flood(port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENTRACE_")}
    env["PYTHONPATH"] = str(ROOT)
    out = log.open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.flood_target", "--port", str(port)],
        cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
    )  # fmt: skip
    out.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/nothing", timeout=1)
            return proc
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the flood target did not start")


def start_worker(root: Path, server: str, token: str, state: Path, log: Path) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENTRACE_")}
    env["PYTHONPATH"] = str(root)
    env["TOKENTRACE_WORKER_TOKEN"] = token
    cmd = [sys.executable, "-m", "app.cli.main", "worker", "--server", server]
    cmd += ["--state-dir", str(state)]  # the token: in the environment
    out = log.open("ab")
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
    out.close()
    return proc


def stored_requests(api: httpx.Client, run_id: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while True:
        r = api.get(f"/runs/{run_id}/requests", params={"limit": 5000, "offset": len(out)})
        r.raise_for_status()
        page = r.json()
        out += page["items"]
        if not page["items"] or len(out) >= page["total"]:
            return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--mode", default="mixed", choices=("mixed", "streams", "endless", "tiny",
                                                       "bigevent", "valid60"))  # fmt: skip
    ap.add_argument("--time-limit", type=float, default=300.0)
    ap.add_argument("--rss-limit-mb", type=float, default=4000.0)
    ap.add_argument("--code-root", type=Path, default=ROOT, help="the code measured")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/worker_memory.json")
    ap.add_argument("--label", default=None, help="the key of this measurement in --out")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="tt-wmem-"))
    code = args.code_root.resolve()
    live_server.ROOT = code  # the dashboard runs that code too (its spec is that worker's)
    flood_port = free_port()
    flood = start_flood(flood_port, tmp / "flood.log")
    server = LiveServer(f"sqlite:///{tmp / 'dash.db'}", tmp).start()
    worker = None
    samples: list[float] = []
    try:
        api = httpx.Client(
            base_url=server.url + "/api/v1",
            headers={"Authorization": f"Bearer {server.admin_token}"},
            timeout=300,  # the server stores and summarises the run when the job ends
            trust_env=False,
        )
        worker = start_worker(code, server.url, server.worker_token, tmp / "state", tmp / "w.log")
        deadline = time.monotonic() + 60
        while not api.get("/workers").json() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)  # registered; its idle footprint
        idle = rss_mb(worker.pid)
        spec = {
            "base_url": f"http://127.0.0.1:{flood_port}/{args.mode}",
            "model": "m",
            "input_len": 16,
            "output_len": 16,
            "num_prompts": args.requests,
            "max_concurrency": args.streams,
            "request_timeout_s": 120,
        }
        r = api.post("/runs", json=spec)
        r.raise_for_status()
        run_id, job_id = r.json()["run_id"], r.json()["job_id"]
        t0 = time.monotonic()
        stop = threading.Event()
        killed = False

        def sample() -> None:
            nonlocal killed
            while not stop.is_set() and worker.poll() is None:
                mb = rss_mb(worker.pid)
                samples.append(mb)
                if mb > args.rss_limit_mb and not killed:
                    killed = True
                    worker.kill()
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        state = "?"
        while time.monotonic() - t0 < args.time_limit:
            state = api.get(f"/jobs/{job_id}").json()["state"]
            if state in ("succeeded", "failed", "cancelled") or worker.poll() is not None:
                break
            time.sleep(0.5)
        seconds = time.monotonic() - t0
        stop.set()
        sampler.join(2)
        time.sleep(1.0)
        state = api.get(f"/jobs/{job_id}").json()["state"]
        reqs = stored_requests(api, run_id)
        run = api.get(f"/runs/{run_id}").json()
        load = (run.get("report") or {}).get("load") or {}
        reasons = collections.Counter(f"{q['status']}: {q.get('error')}" for q in reqs)
        result = {
            "code_root": str(code),
            "mode": args.mode,
            "streams": args.streams,
            "requests": args.requests,
            "worker_rss_idle_mb": round(idle, 1),
            "worker_rss_peak_mb": round(max(samples, default=0.0), 1),
            "killed_past_rss_limit_mb": args.rss_limit_mb if killed else None,
            "job_state": state,
            "seconds": round(seconds, 1),
            "timed_out": seconds >= args.time_limit,
            "stored_requests": len(reqs),
            "by_reason": dict(reasons.most_common()),
            "server_metrics": load.get("server_metrics"),
            "served_models_error": load.get("served_models_error"),
            "host": platform.node(),
            "cpus": os.cpu_count(),
        }
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
        server.stop()
        flood.kill()
    print(json.dumps(result, indent=2))
    out: dict[str, Any] = {}
    if args.out.exists():
        try:
            out = json.loads(args.out.read_text())
        except ValueError:
            out = {}
    out[args.label or f"{args.mode}_{args.streams}"] = result
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
