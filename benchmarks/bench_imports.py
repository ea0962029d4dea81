"""Import of a big ``vllm bench serve --save-result --save-detailed`` file: time and memory.

    python benchmarks/bench_imports.py [--requests 10000] [--tokens 1000]
        [--out benchmarks/results/imports.json] [--app-root DIR]

Writes a vLLM result file of ``requests`` requests with ``tokens`` output tokens each (one
chunk per token: ``tokens - 1`` ITLs per request, about 80 MB at the defaults) in a temporary
directory, then imports it with ``tokentrace``'s import service (``import_path``, what
``tokentrace import --format vllm`` runs) in a fresh subprocess into a temporary SQLite file,
and reports the import's seconds (wall and CPU: the wall time is noisy on a busy machine) and
the importing process's peak resident memory (VmHWM of /proc/self/status; target <= 500 MB,
issue 14 item 5). The import includes what it always did after storing: the run's report,
whose headline figures are cached on the run row. ``--app-root`` imports another
checkout's code in the subprocess (for before/after figures).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def write_vllm_file(path: Path, n_requests: int, n_tokens: int, seed: int = 0) -> None:
    """A detailed vLLM result: ITLs ~10 ms (4 decimals, as long as vLLM's are short), TTFTs
    50-200 ms, a request started every 20 ms; 1 in 500 requests failed."""
    rng = np.random.default_rng(seed)
    failed = set(range(499, n_requests, 500))
    ttfts = np.round(rng.uniform(0.05, 0.2, n_requests), 6)
    starts = np.round(1_700_000_000.0 + np.arange(n_requests) * 0.02, 6)
    with path.open("w", encoding="utf-8") as f:
        head = {
            "date": "20261201-120000",
            "backend": "openai-chat",
            "endpoint_type": "openai-chat",
            "label": None,
            "model_id": "bench/model",
            "tokenizer_id": "bench/model",
            "num_prompts": n_requests,
            "request_rate": "inf",
            "burstiness": 1.0,
            "max_concurrency": 256,
            "duration": float(n_requests * 0.02 + 12.0),
            "completed": n_requests - len(failed),
            "failed": len(failed),
            "mean_ttft_ms": 125.0,
            "median_ttft_ms": 125.0,
            "p99_ttft_ms": 198.0,
        }
        f.write(json.dumps(head)[:-1])
        f.write(', "input_lens": ' + json.dumps([128] * n_requests))
        f.write(
            ', "output_lens": '
            + json.dumps([0 if i in failed else n_tokens for i in range(n_requests)])
        )
        f.write(', "ttfts": ' + json.dumps([0.0 if i in failed else float(t) for i, t in
                                              enumerate(ttfts)]))  # fmt: skip
        f.write(', "itls": [')
        for i in range(n_requests):
            gaps = [] if i in failed else np.round(rng.normal(0.01, 0.002, n_tokens - 1), 4)
            f.write(("" if i == 0 else ", ") + json.dumps([abs(float(g)) for g in gaps]))
        f.write("]")
        f.write(', "errors": ' + json.dumps(["Timeout" if i in failed else "" for i in
                                               range(n_requests)]))  # fmt: skip
        f.write(', "start_times": ' + json.dumps([float(s) for s in starts]) + "}\n")


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def child(file: Path, url: str) -> None:
    """Runs in the subprocess: migrate, import, print one JSON line."""
    from app.services.file_imports import import_path
    from app.services.runs import open_database
    from app.storage import repository as repo
    from app.storage.db import session_scope

    sessions = open_database(url)
    before = peak_rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    (run_id,) = import_path(sessions, "vllm", file)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = peak_rss_mb()
    with session_scope(sessions) as s:
        stored = repo.count_requests(s, run_id)
    print(
        json.dumps(
            {
                "import_s": seconds,
                "import_cpu_s": cpu,
                "peak_rss_mb": peak,
                "rss_before_import_mb": before,
                "requests_stored": stored,
            }
        )
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--tokens", type=int, default=1_000)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "imports.json")
    ap.add_argument("--app-root", type=Path, default=ROOT, help="the checkout to import with")
    ap.add_argument("--child", nargs=2, metavar=("FILE", "URL"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        sys.path.insert(0, str(args.app_root))
        child(Path(args.child[0]), args.child[1])
        return 0
    with tempfile.TemporaryDirectory(prefix="tt-bench-imports-") as tmp:
        file = Path(tmp) / "vllm-detailed.json"
        write_vllm_file(file, args.requests, args.tokens)
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        env = {**os.environ, "PYTHONPATH": str(args.app_root)}
        out = subprocess.run(
            [sys.executable, __file__, "--app-root", str(args.app_root), "--child", str(file), url],
            check=True,
            capture_output=True,
            text=True,
            cwd=args.app_root,
            env=env,
        ).stdout
        figures: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        result = {
            "file_mb": file.stat().st_size / 1e6,
            "requests": args.requests,
            "tokens_per_request": args.tokens,
            "events": args.requests * args.tokens,
            "backend": "sqlite",
            **figures,
            "target_peak_rss_mb": 500,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        }
    if result["requests_stored"] != args.requests:
        raise SystemExit(f"stored {result['requests_stored']} of {args.requests} requests")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"import of {result['file_mb']:.1f} MB ({result['events']:,} events): "
        f"{result['import_s']:.2f} s, peak RSS {result['peak_rss_mb']:.0f} MB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
