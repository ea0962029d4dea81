"""What the server controls cost a run: the gap between the last warm-up's end and the first
measured request, with no controls, with the spec-decode counter readings (the default of an
observed run), and with the prefix-cache reset and the profiler as well; on the simulator
(loopback, in-process), ``--runs`` runs each.

    python benchmarks/bench_server_controls.py [--runs 9] [--out FILE]

(default FILE: benchmarks/results/server_controls.json)

The gap is what the controls add between the warm-ups and the measured window (they never
fall inside it: the window starts after them, and the stop/reading after it ends).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from app.client.execute import execute
from app.client.runner import LoadResult, run_load
from app.client.spec import RunSpec
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread

CASES: dict[str, dict[str, Any]] = {
    "none": {"scrape_metrics": False},
    "counters": {},
    "reset+profile+counters": {"reset_prefix_cache": True, "server_profile": True},
}


def _load(spec: RunSpec, tag: str) -> Callable[[], Awaitable[LoadResult]]:
    return lambda: run_load(spec, run_tag=tag, read_server_counters=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=9)
    p.add_argument("--out", default="benchmarks/results/server_controls.json")
    ns = p.parse_args()
    sim = start_simulator_thread(
        SimConfig(ttft_ms=2, itl_ms=0.5, spec_decode_draft_len=3, prefix_cache_block=16)
    )
    out: dict[str, Any] = {"host": platform.node(), "runs": ns.runs, "gap_ms": {}}
    try:
        for label, kw in CASES.items():
            gaps: list[float] = []
            for i in range(ns.runs):
                spec = RunSpec(base_url=sim.base_url, model="tokentrace-sim", num_prompts=4,
                               warmup_requests=2, input_len=16, output_len=4, **kw)  # fmt: skip
                done = asyncio.run(execute(spec, _load(spec, f"b{i}")))
                assert done.result is not None, done.error
                warm_end = max(r.end_ns for r in done.result.records if r.warmup)
                gaps.append((done.result.measure_start_ns - warm_end) / 1e6)
            out["gap_ms"][label] = {
                "median": round(statistics.median(gaps), 2),
                "max": round(max(gaps), 2),
            }
            print(label, out["gap_ms"][label])
    finally:
        sim.stop()
    Path(ns.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
