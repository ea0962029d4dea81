"""Multi-turn sessions: how soon after a reply ends does its session's next turn leave?

    python benchmarks/bench_sessions.py [--sessions 256] [--turns 4] [--think-ms 0 50]
        [--out benchmarks/results/sessions.json]

The simulator runs in its own process (TTFT 20 ms, ITL 5 ms, 32 output tokens per turn);
``--sessions`` sessions run at once (``max_concurrency`` = sessions), each replaying a
``--turns``-turn conversation of a generated JSONL file, with every think time of
``--think-ms``, the sessions started all at once (their turns then end together: the
worst case, every next turn built in the same moment) or at ``--rates`` per second. For
each pair of consecutive turns of a session, from the records: the gap
``next turn's send - previous reply's end - think time`` (ms): p50, p99, max and the share
within 1 ms (the issue's target), plus the runner's send lag (it measures the same from
each turn's due time) and event-loop lag. Timing on a shared machine is noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.client.runner import run_load
from app.client.spec import RunSpec
from app.domain import RequestStatus
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_process


def gaps_ms(records: list[Any], think_ms: float) -> np.ndarray:
    recs = sorted((r for r in records if not r.warmup), key=lambda r: (r.session, r.turn))
    out = [
        (b.sent_ns - a.end_ns) / 1e6 - think_ms
        for a, b in itertools.pairwise(recs)
        if a.session == b.session and a.end_ns is not None and b.sent_ns is not None
    ]
    return np.asarray(out, np.float64)


def case(url: str, path: str, sessions: int, think_ms: float, rate: float) -> dict[str, Any]:
    spec = RunSpec(
        base_url=url,
        model="sim",
        dataset="jsonl",
        dataset_path=path,
        multi_turn=True,
        turn_delay_ms=think_ms,
        request_rate=rate,
        arrival="constant",
        num_prompts=sessions,
        max_concurrency=sessions,
        output_len=32,
        scrape_metrics=False,
        request_timeout_s=60,
    )
    res = asyncio.run(run_load(spec, run_tag="bench"))
    g = gaps_ms(res.records, think_ms)
    ok = sum(1 for r in res.records if r.status is RequestStatus.OK)
    p50, p99 = np.percentile(g, [50, 99]) if g.size else (float("nan"), float("nan"))
    return {
        "sessions": sessions,
        "think_ms": think_ms,
        "session_rate_per_s": "inf" if rate == float("inf") else rate,
        "requests": len(res.records),
        "ok": ok,
        "turn_pairs": int(g.size),
        "gap_ms": {
            "p50": float(p50),
            "p99": float(p99),
            "max": float(g.max()) if g.size else None,
            "min": float(g.min()) if g.size else None,
        },
        "share_within_1ms": float((g <= 1.0).mean()) if g.size else None,
        "send_lag_ms": {"p50": res.send_lag.p50_ms, "p99": res.send_lag.p99_ms},
        "loop_lag_ms": {"p50": res.loop_lag.p50_ms, "p99": res.loop_lag.p99_ms},
        "max_in_flight": res.max_in_flight,
        "clock_source": res.clock_source.value,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=256)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--think-ms", type=float, nargs="+", default=[0.0, 50.0])
    ap.add_argument(
        "--rates",
        type=float,
        nargs="+",
        default=[float("inf"), 100.0],
        help="session start rates (per s): inf starts every session at once (their turns "
        "then end together), a finite rate staggers them",
    )
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sessions.json"))
    args = ap.parse_args()
    cfg = SimConfig(ttft_ms=20, itl_ms=5, seed=1, record_ground_truth=False)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "conv.jsonl"
        words = " ".join(f"w{i}" for i in range(64))
        line = {"turns": [f"turn {k}: {words}" for k in range(args.turns)]}
        path.write_text(json.dumps(line) + "\n")
        with start_simulator_process(cfg) as sim:
            for rate in args.rates:
                for think in args.think_ms:
                    rows.append(case(sim.base_url, str(path), args.sessions, think, rate))
    out = {
        "host": platform.node(),
        "python": platform.python_version(),
        "note": "timing on a shared machine; noisy under contention",
        "simulator": {"ttft_ms": 20, "itl_ms": 5, "output_tokens": 32},
        "turns_per_session": args.turns,
        "cases": rows,
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
