"""The server's memory under anonymous bodies and pages, compares and imports (issue 23
items 5 and 7): its RSS growth per request, measured as bench_exports.py does.

    python benchmarks/bench_server_memory.py [--requests 10000] [--tokens 1000]
        [--import-events 20000000] [--app-root DIR] [--out FILE]

Seeds two synthetic runs of ``requests`` x ``tokens`` events (bench_storage.py's records,
one token per event) and two small ones in a temporary SQLite file and finalizes them (the
run summaries stored), starts ``tokentrace serve`` on it (no embedded worker) from
``--app-root`` (default this checkout; another checkout gives before figures), warms each
route up on the small runs, then sends each case while sampling the server's resident
memory every 50 ms; a case's growth is its peak over the RSS just before it. Cases:

* anonymous bodies: a 64 MiB JSON result batch to ``/api/v1/jobs/{id}/results`` (one, then
  three at once) and a 64 MiB chunked upload to ``/api/v1/imports`` (the client sends the
  body as a real one does; the status is what came back, or ``reset`` when the server
  closed first);
* anonymous pages: ``/api/v1/compare`` and ``/compare`` of the two big runs, ``/compare``
  with one id six times, three ``/compare`` at once, and ``GET /api/v1/runs/{id}`` with
  ``profile=vllm-legacy``;
* imports with a run token: a vLLM file of ``import-events`` zero gaps (two bytes an event,
  the issue's file) and one within the event limit, then two imports at once (one 429).

Target (issue 23): growth <= 50 MB per anonymous request; no 5xx.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_exports import free_port, rss_mb
from bench_exports import seed as seed_run

from app.domain import RunStatus
from app.services.runs import finalize_run, open_database
from tests.live_server import make_token

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
TARGET_MB = 50


class Sampler:
    """The server's peak RSS while a case runs, over its RSS just before."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def measure(self, work: Callable[[], Any]) -> dict[str, Any]:
        peak = [0.0]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], rss_mb(self.pid))
                time.sleep(0.05)

        time.sleep(0.3)
        base = rss_mb(self.pid)
        t = threading.Thread(target=sample, daemon=True)
        t.start()
        t0 = time.monotonic()
        result = work()
        seconds = time.monotonic() - t0
        time.sleep(0.1)
        done.set()
        t.join()
        return {
            "result": result,
            "seconds": round(seconds, 2),
            "server_rss_before_mb": round(base, 1),
            "server_rss_peak_mb": round(peak[0], 1),
            "server_rss_growth_mb": round(max(peak[0] - base, 0.0), 1),
        }


def raw_post(port: int, path: str, headers: dict[str, str], body: Iterator[bytes]) -> str:
    """POST as a client that sends its whole body at once: the status that came back, or
    ``reset`` when the server closed the connection before an answer could be read."""
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    sock = socket.create_connection(("127.0.0.1", port), timeout=300)

    def write() -> None:
        try:
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            for chunk in body:
                sock.sendall(chunk)
        except OSError:
            pass

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    data = b""
    try:
        while b"\r\n" not in data:
            got = sock.recv(65536)
            if not got:
                break
            data += got
    except OSError:
        pass
    sock.close()
    writer.join(60)
    return data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "reset"


def batch_body(size: int) -> bytes:
    """A result batch of small request objects, ``size`` bytes (what the issue sent)."""
    item = b'{"index":0,"status":"ok"},'
    head, tail = b'{"lease_id":"x","batch_no":0,"requests":[', b'{"index":0}]}'
    n = (size - len(head) - len(tail)) // len(item)
    body = head + item * n + tail
    return body + b" " * (size - len(body))


def pieces(data: bytes, step: int = MIB) -> Iterator[bytes]:
    for i in range(0, len(data), step):
        yield data[i : i + step]


def chunked(data: bytes, step: int = MIB) -> Iterator[bytes]:
    for piece in pieces(data, step):
        yield f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    yield b"0\r\n\r\n"


def at_once(n: int, work: Callable[[], Any]) -> list[Any]:
    out: list[Any] = [None] * n

    def one(i: int) -> None:
        out[i] = work()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def zero_gap_vllm(n_requests: int, gaps: int) -> bytes:
    """A detailed vLLM result whose every gap is ``0``: two bytes an event."""
    row = b"[" + b",".join([b"0"] * gaps) + b"]"
    head = {
        "date": "20261201-120000", "backend": "vllm", "model_id": "m", "num_prompts": n_requests,
        "request_rate": 4.0, "duration": 100.0, "completed": n_requests, "failed": 0,
        "input_lens": [10] * n_requests, "output_lens": [gaps + 1] * n_requests,
        "ttfts": [0.05] * n_requests, "errors": [""] * n_requests,
        "start_times": [1_700_000_000.0 + i for i in range(n_requests)],
    }  # fmt: skip
    return json.dumps(head)[:-1].encode() + b', "itls": [' + b",".join([row] * n_requests) + b"]}"


def multipart(fields: dict[str, str], file: bytes) -> tuple[bytes, str]:
    b = "tt-bench-boundary"
    parts = [
        f'--{b}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in fields.items()
    ]
    parts.append(
        f'--{b}\r\nContent-Disposition: form-data; name="file"; filename="f.json"\r\n'
        "Content-Type: application/json\r\n\r\n".encode()
        + file
        + f"\r\n--{b}--\r\n".encode()
    )
    return b"".join(parts), f"multipart/form-data; boundary={b}"


def seed(url: str, n: int, tokens: int) -> dict[str, str]:
    runs = {
        "big_a": seed_run(url, n, tokens),
        "big_b": seed_run(url, n, tokens),
        "small_a": seed_run(url, 100, 10),
        "small_b": seed_run(url, 100, 10),
    }
    sessions = open_database(url)
    for run_id in runs.values():  # as a job's completion does: the summaries stored
        finalize_run(sessions, run_id, status=RunStatus.SUCCEEDED, meta=None)
    sessions.kw["bind"].dispose()
    return runs


def start_server(url: str, app_root: Path, port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENTRACE_")}
    env |= {"TOKENTRACE_DATABASE_URL": url, "TOKENTRACE_PORT": str(port),
            "TOKENTRACE_LOCAL_WORKER": "false", "PYTHONPATH": str(app_root)}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli.main", "serve", "--log-level", "warning"],
        env=env, cwd=app_root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the server did not start")


def run_cases(
    port: int, pid: int, runs: dict[str, str], run_token: str, import_events: int
) -> dict[str, Any]:
    base = f"http://127.0.0.1:{port}"
    m = Sampler(pid)
    a, b = runs["big_a"], runs["big_b"]

    def get(path: str, **kw: Any) -> int:
        return httpx.get(base + path, timeout=600, **kw).status_code

    # warm-up: every route once on the small runs (code loaded, caches filled)
    get(f"/api/v1/compare/{runs['small_a']}", params={"ids": runs["small_b"]})
    get(f"/compare?ids={runs['small_a']}&ids={runs['small_b']}")
    get(f"/api/v1/runs/{runs['small_a']}", params={"profile": "vllm-legacy"})
    raw_post(port, "/api/v1/jobs/x/results", {"Content-Length": "10"}, iter([b"{}" * 5]))
    out = body_cases(port, m)
    out["compare_api"] = m.measure(lambda: get(f"/api/v1/compare/{a}", params={"ids": b}))
    out["compare_page"] = m.measure(lambda: get(f"/compare?ids={a}&ids={b}"))
    six = "/compare?" + "&".join([f"ids={a}"] * 6)
    out["compare_page_same_id_x6"] = m.measure(lambda: get(six))
    out["compare_page_x3"] = m.measure(lambda: at_once(3, lambda: get(f"/compare?ids={a}&ids={b}")))
    legacy = {"profile": "vllm-legacy"}
    out["run_api_vllm_legacy"] = m.measure(lambda: get(f"/api/v1/runs/{a}", params=legacy))
    return out | import_cases(base, m, run_token, import_events)


def body_cases(port: int, m: Sampler) -> dict[str, Any]:
    """64 MiB anonymous bodies: a result batch (one, three at once), a chunked upload."""
    body = batch_body(64 * MIB)
    path = "/api/v1/jobs/x/results"
    json_h = {"Content-Type": "application/json", "Content-Length": str(len(body))}
    form, ctype = multipart({"format": "vllm"}, body)
    chunk_h = {"Content-Type": ctype, "Transfer-Encoding": "chunked"}
    return {
        "anon_results_64mib": m.measure(lambda: raw_post(port, path, json_h, pieces(body))),
        "anon_results_64mib_x3": m.measure(
            lambda: at_once(3, lambda: raw_post(port, path, json_h, pieces(body)))
        ),
        "anon_import_chunked_64mib": m.measure(
            lambda: raw_post(port, "/api/v1/imports", chunk_h, chunked(form))
        ),
    }


def import_cases(base: str, m: Sampler, run_token: str, events: int) -> dict[str, Any]:
    """vLLM files of zero gaps with a run token: over the event limit, within it, two
    within it at once."""
    auth = {"Authorization": f"Bearer {run_token}"}

    def upload(data: bytes) -> int:
        r = httpx.post(base + "/api/v1/imports", data={"format": "vllm"},
                       files={"file": ("f.json", data)}, headers=auth, timeout=900)  # fmt: skip
        return r.status_code

    def case(n_events: int, n: int = 1) -> dict[str, Any]:
        data = zero_gap_vllm(100, n_events // 100)
        work = (lambda: upload(data)) if n == 1 else (lambda: at_once(n, lambda: upload(data)))
        return m.measure(work) | {"events_each": n_events, "file_mb": round(len(data) / 1e6, 1)}

    within = 5_000_000
    return {
        "import_over_limit": case(events),
        "import_within_limit": case(within),
        "imports_x2": case(within, 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--tokens", type=int, default=1_000)
    ap.add_argument("--import-events", type=int, default=20_000_000)
    ap.add_argument("--app-root", type=Path, default=ROOT, help="the checkout the server runs")
    ap.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "server_memory.json"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tt-mem-") as d:
        url = f"sqlite:///{Path(d) / 'mem.db'}"
        t0 = time.monotonic()
        runs = seed(url, args.requests, args.tokens)
        seeded_s = time.monotonic() - t0
        run_token = make_token(url, "run", name="bench")
        port = free_port()
        proc = start_server(url, args.app_root, port)
        try:
            cases = run_cases(port, proc.pid, runs, run_token, args.import_events)
            alive = proc.poll() is None
        finally:
            proc.terminate()
            proc.wait(30)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.app_root,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    out = {
        "app_root": str(args.app_root),
        "commit": commit,
        "run_events": args.requests * args.tokens,
        "requests": args.requests,
        "tokens_per_request": args.tokens,
        "seed_and_finalize_s": round(seeded_s, 1),
        "target_growth_mb_per_anonymous_request": TARGET_MB,
        "server_alive_after": alive,
        "cases": cases,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for name, c in cases.items():
        grew = c["server_rss_growth_mb"]
        print(f"{name:28s} {c['result']!s:28s} {c['seconds']:7.2f} s  +{grew:.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
