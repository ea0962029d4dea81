"""Workload benchmark: how closely a Mooncake trace replay keeps the trace's schedule.

    python benchmarks/bench_workloads.py [--rate 100] [--requests 1000] [--warmups 32]
        [--realtime] [--out benchmarks/results/workloads.json]

A synthetic Mooncake trace (seeded Poisson arrivals at ``rate`` req/s, 512-token blocks
with a shared system prefix, 16 output tokens) is replayed by ``tokentrace bench
--dataset-name mooncake`` (the runner, in this process) against the simulator in its own
process (TTFT 20 ms, ITL 5 ms), after ``--warmups`` warm-up requests sent at once: they open
the kept-alive connections the replay reuses (docs/client.md). Arrival lateness per request
is recomputed from the records (each record's ``sent_ns``, t0, minus its ``scheduled_ns``,
the trace's time) and reported as p50/p99/max in ms, beside the run's own
``trace_lateness_ms`` (the same stamps). The target (issue 16): p99 within 1 ms at 100
req/s. On a shared machine the figure is noisy: it measures the client's event loop under
whatever else runs (``cpu_wait_ms``: how long per 5 ms tick the load thread waited for a
CPU; ``load_avg_1m``); ``--realtime`` keeps other tasks off the load thread's CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.client.execute import load_stats
from app.client.runner import run_load_sync
from app.client.spec import RunSpec
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_process


def synthetic_trace(path: Path, rate: float, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    t = np.concatenate([[0.0], np.cumsum(rng.exponential(1000.0 / rate, n - 1))])
    lines = []
    for i in range(n):
        blocks = int(rng.integers(1, 4))
        ids = [0] + [1_000 + i * 4 + k for k in range(blocks)]  # block 0 shared by all
        n_in = 512 * blocks + int(rng.integers(1, 512))
        row = {"timestamp": round(float(t[i]), 3), "input_length": n_in}
        lines.append(row | {"output_length": 16, "hash_ids": ids})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument(
        "--warmups",
        type=int,
        default=32,
        help="warm-up requests, sent at once before the trace: they open the connections the "
        "replay then reuses (0: each new connection's connect falls inside a request's lateness)",
    )
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "workloads.json"))
    ap.add_argument(
        "--realtime",
        action="store_true",
        help="run the load thread at real-time priority (app.client.sched; needs the right)",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "trace.jsonl"
        synthetic_trace(trace, args.rate, args.requests)
        sim = start_simulator_process(SimConfig(ttft_ms=20.0, itl_ms=5.0, seed=1))
        try:
            spec = RunSpec(
                base_url=sim.base_url,
                model="tokentrace-sim",
                dataset="mooncake",
                dataset_path=str(trace),
                num_prompts=args.requests,
                warmup_requests=args.warmups,
                scrape_metrics=False,
            )
            c0 = time.process_time()
            res = run_load_sync(spec, run_tag="wl", handle_sigint=False, realtime=args.realtime)
            cpu_s = time.process_time() - c0
        finally:
            sim.stop()
    recs = [r for r in res.records if not r.warmup and r.sent_ns is not None]
    late_ms = np.asarray([(r.sent_ns or 0) - r.scheduled_ns for r in recs], np.float64) / 1e6
    stats = load_stats(res)
    p50, p99 = np.percentile(late_ms, [50, 99])
    out: dict[str, Any] = {
        "host": platform.node(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
        "trace": {"rate_rps": args.rate, "requests": args.requests, "block_size": 512},
        "warmup_requests": args.warmups,
        "connections": res.connections,
        "ok": res.counts["ok"],
        "sent": res.counts["sent"],
        "achieved_send_rate_rps": res.achieved_send_rate,
        "scheduling": res.scheduling.as_dict(),
        "arrival_lateness_ms": {
            "p50": round(float(p50), 4),
            "p99": round(float(p99), 4),
            "max": round(float(late_ms.max()), 4),
        },
        "run_trace_lateness_ms": stats.get("trace_lateness_ms"),
        "loop_lag_ms": stats["loop_lag_ms"],
        "cpu_wait_ms": stats["cpu_wait_ms"],  # per 5 ms tick: the load thread kept off a CPU
        "client_cpu_s": round(cpu_s, 3),
        "prefix_reuse_ratio": (stats.get("workload") or {}).get("prefix_reuse_ratio"),
        "target_p99_ms": 1.0,
        "meets_target": bool(p99 <= 1.0),
        "note": "timing under contention is noisy (shared CPUs)",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    lat, lag = out["arrival_lateness_ms"], stats["loop_lag_ms"]
    print(
        f"trace at {args.rate:g} req/s, {out['sent']} sent: arrival lateness p50 {lat['p50']:.3f}"
        f" ms, p99 {lat['p99']:.3f} ms, max {lat['max']:.3f} ms (target p99 <= 1 ms: "
        f"{'met' if out['meets_target'] else 'not met'}); loop lag p99 {lag['p99_ms']:.2f} ms; "
        f"load thread off-CPU p99 {stats['cpu_wait_ms']['p99_ms'] or 0:.2f} ms per tick",
        file=sys.stderr,
    )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
