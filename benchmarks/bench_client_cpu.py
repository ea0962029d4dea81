"""The client's CPU per streamed token, for comparing two versions of the client.

Runs one load (the simulator in its own process) and prints the load thread's process CPU
(user + system, the simulator excluded) per output token. It only uses APIs every version
has, so the same file measures another checkout: ``PYTHONPATH=/path/to/other/checkout
python benchmarks/bench_client_cpu.py``.

    python benchmarks/bench_client_cpu.py --streams 256 --requests 1024
"""

from __future__ import annotations

import argparse
import json
import resource

from app.client.runner import run_load_sync
from app.client.spec import RunSpec
from app.domain import RequestStatus
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_process


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--requests", type=int, default=1024)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    args = ap.parse_args()
    cfg = SimConfig(ttft_ms=50.0, itl_ms=args.itl_ms, output_len=args.output_len)
    with start_simulator_process(cfg) as sim:
        spec = RunSpec(
            base_url=sim.base_url,
            model="sim",
            input_len=32,
            output_len=args.output_len,
            num_prompts=args.requests,
            max_concurrency=args.streams,
            request_timeout_s=120,
            scrape_metrics=False,
        )
        c0 = resource.getrusage(resource.RUSAGE_SELF)
        res = run_load_sync(spec, run_tag="cpu", handle_sigint=False)
        c1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    ok = [r for r in res.records if r.status is RequestStatus.OK]
    tokens = sum(r.output_tokens or 0 for r in ok)
    out = {
        "streams": args.streams,
        "requests": args.requests,
        "ok": len(ok),
        "tokens": tokens,
        "client_cpu_s": round(cpu_s, 3),
        "client_cpu_us_per_token": round(cpu_s * 1e6 / tokens, 2) if tokens else None,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
