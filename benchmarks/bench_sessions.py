"""Multi-turn sessions: how soon after a reply ends does its session's next turn leave?

    python benchmarks/bench_sessions.py [--sessions 256] [--turns 4] [--think-ms 0 50]
        [--rates inf 100] [--lengths fixed varied] [--realtime] [--no-pin]
        [--itl-ms 5] [--out benchmarks/results/sessions.json]

The simulator runs in its own process (TTFT 20 ms, ITL 5 ms); ``--sessions`` sessions run
at once (``max_concurrency`` = sessions), each replaying a ``--turns``-turn conversation
(64-word human turns), with every think time of ``--think-ms``, the sessions started all at
once (rate inf) or at ``--rates`` per second. Two reply-length cases:

* ``fixed``: every reply 32 tokens. Started at once, every session's turn then ends in the
  same moment, so all next turns are built and sent in one burst: this row measures how
  long the client takes to work through 256 next turns, not one session's wait.
* ``varied``: each turn's reply length drawn per conversation (log-normal, median 32
  tokens, 4..256, as ShareGPT's replies spread), so reply ends spread out as with real
  conversations.

For each pair of consecutive turns of a session, from the records: the gap ``next turn's
send stamp - previous reply's end stamp - think time`` (ms; the records' ``sent_ns`` and
``end_ns``): p50, p99, max and the share within 1 ms (the target of issue 16), plus the
runner's send lag (the same from each turn's due time), event-loop lag and the client's
CPU time per turn. Timing on a shared machine is noisy.

The simulator stands for a server on its own machine: with two CPUs or more it is pinned
to the last CPU and this process (the client) to the others (``--no-pin`` lets the
kernel place both), so that neither takes the other's CPU in the middle of a turn.
"""

from __future__ import annotations

import argparse
import itertools
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

from app.client import eventloop
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


def conversations(path: Path, n: int, turns: int, lengths: str, seed: int = 0) -> None:
    """``n`` conversations of ``turns`` 64-word human turns; each assistant message's token
    count is the reply length asked for that turn (``max_tokens``)."""
    rng = np.random.default_rng(seed)
    words = " ".join(f"w{i}" for i in range(64))
    lines = []
    for _ in range(n):
        if lengths == "fixed":
            outs = [32] * turns
        else:
            drawn = np.clip(np.round(rng.lognormal(np.log(32), 0.8, turns)), 4, 256)
            outs = [int(o) for o in drawn]
        msgs: list[dict[str, str]] = []
        for k, o in enumerate(outs):
            msgs.append({"role": "user", "content": f"turn {k}: {words}"})
            msgs.append({"role": "assistant", "content": " ".join(["x"] * int(o))})
        lines.append(json.dumps({"messages": msgs}))
    path.write_text("\n".join(lines) + "\n")


def case(
    url: str,
    path: str,
    sessions: int,
    think_ms: float,
    rate: float,
    lengths: str,
    realtime: bool = False,
) -> dict[str, Any]:
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

    async def load() -> tuple[Any, float]:
        c0 = time.process_time()
        res = await run_load(spec, run_tag="bench", realtime=realtime)
        return res, time.process_time() - c0

    res, cpu_s = eventloop.run(load())
    g = gaps_ms(res.records, think_ms)
    ok = sum(1 for r in res.records if r.status is RequestStatus.OK)
    p50, p99 = np.percentile(g, [50, 99]) if g.size else (float("nan"), float("nan"))
    return {
        "lengths": lengths,
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
        "scheduling": res.scheduling.as_dict(),
        "cpu_wait_ms": {"p99": res.cpu_wait.p99_ms, "max": res.cpu_wait.max_ms},
        "output_tokens_mean": float(np.mean([r.output_tokens or 0 for r in res.records])),
        "client_cpu_ms_per_turn": round(cpu_s * 1e3 / max(1, len(res.records)), 3),
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
    ap.add_argument(
        "--lengths", nargs="+", choices=("fixed", "varied"), default=["fixed", "varied"]
    )
    ap.add_argument(
        "--realtime",
        action="store_true",
        help="run the load thread at real-time priority (app.client.sched; needs the right)",
    )
    ap.add_argument(
        "--no-pin",
        action="store_true",
        help="let the kernel place the simulator and the client (default: pinned apart)",
    )
    ap.add_argument("--ttft-ms", type=float, default=20.0, help="the simulator's TTFT")
    ap.add_argument(
        "--itl-ms",
        type=float,
        default=5.0,
        help="the simulator's ITL: 5 ms at 256 sessions is ~51k chunks/s, this 2-core "
        "machine's client capacity (capacity.json); a real server batching 256 streams "
        "decodes at ~20-50 ms",
    )
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sessions.json"))
    args = ap.parse_args()
    cfg = SimConfig(ttft_ms=args.ttft_ms, itl_ms=args.itl_ms, seed=1, record_ground_truth=False)
    rows: list[dict[str, Any]] = []
    cpus = sorted(os.sched_getaffinity(0))
    pinned = not args.no_pin and len(cpus) >= 2
    sim_cpus = {cpus[-1]} if pinned else None
    if pinned:
        os.sched_setaffinity(0, set(cpus[:-1]))
    with (
        tempfile.TemporaryDirectory() as tmp,
        start_simulator_process(cfg, cpus=sim_cpus) as sim,
    ):
        for lengths in args.lengths:
            path = Path(tmp) / f"conv-{lengths}.jsonl"
            conversations(path, args.sessions, args.turns, lengths)
            for rate in args.rates:
                for think in args.think_ms:
                    row = case(
                        sim.base_url, str(path), args.sessions, think, rate, lengths, args.realtime
                    )
                    rows.append(row)
                    print(summary_line(row), file=sys.stderr)
    out = {
        "host": platform.node(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
        "note": "timing on a shared machine; noisy under contention",
        "simulator": {"ttft_ms": args.ttft_ms, "itl_ms": args.itl_ms},
        "pinning": {
            "client": sorted(os.sched_getaffinity(0)),
            "simulator": sorted(sim_cpus) if sim_cpus else "any",
        },
        "turns_per_session": args.turns,
        "cases": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))
    return 0


def summary_line(row: dict[str, Any]) -> str:
    g = row["gap_ms"]
    return (
        f"{row['lengths']:>6} replies, {row['sessions']} sessions at "
        f"{row['session_rate_per_s']}/s, think {row['think_ms']:g} ms: next-turn gap p50 "
        f"{g['p50']:.2f} ms, p99 {g['p99']:.2f} ms, max {g['max']:.2f} ms, "
        f"{100 * (row['share_within_1ms'] or 0):.0f}% within 1 ms; loop lag p99 "
        f"{row['loop_lag_ms']['p99']:.2f} ms; client CPU {row['client_cpu_ms_per_turn']} ms/turn"
    )


if __name__ == "__main__":
    raise SystemExit(main())
