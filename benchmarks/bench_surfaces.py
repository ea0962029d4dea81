"""Client fidelity for every API surface (issue 25), against the simulator's own view, with
``bench_client_fidelity.py``: TTFT |error| for the streaming surfaces (chat, completions:
the same figures as before the endpoint registry; the Responses API and Anthropic Messages,
whose first content event is their first ``response.output_text.delta`` /
``content_block_delta``), E2E |error| for the surfaces that answer
once (embeddings, rerank in each of its shapes), and the embeddings throughput of one client
process on small inputs (no answer latency: as fast as the client and the simulator go).

    python benchmarks/bench_surfaces.py [--quick] [--only chat embeddings ...]
        [--out benchmarks/results/fidelity_surfaces.json]

``--only`` runs the cases whose name starts with one of the words and updates those in the
results file, keeping the others.

Targets: TTFT |error| p99 <= 0.1 ms (streaming), E2E |error| p99 <= 0.1 ms (embeddings,
rerank), >= 5,000 embeddings requests/s from one process with E2E |error| p99 <= 0.1 ms
(the throughput cases run 3 times; the fastest is shown, every run kept beside it).
The machine is shared: each case records the 1-minute load average, the time the load
thread waited for a CPU others held, and the client's and the simulator's CPU per request
(what one core to itself would allow: 1e6 / that; the simulator's says when it, not the
client, was the limit).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FIDELITY = HERE / "bench_client_fidelity.py"
PIN = ["--sim-cpus", "1", "--client-cpus", "0"] if (os.cpu_count() or 1) >= 2 else []


def fidelity(args: list[str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(FIDELITY), *args, "--json"],
        check=True,
        capture_output=True,
        text=True,
        cwd=HERE.parent,
    ).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["args"] = args
    result.setdefault("load_avg_1m", os.getloadavg()[0])
    return result


THROUGHPUT_REPS = 3  # a shared machine: capacity is the best of these, each kept


def repeated(case: list[str]) -> dict[str, Any]:
    """The throughput case run ``THROUGHPUT_REPS`` times: the fastest run's figures, with
    every run's rate, E2E error p99, CPU wait and load average beside them."""
    runs = [fidelity(case) for _ in range(THROUGHPUT_REPS)]
    best = max(runs, key=lambda r: r.get("request_throughput_req_s") or 0.0)
    best["repetitions"] = [
        {
            "request_throughput_req_s": r.get("request_throughput_req_s"),
            "e2e_error_p99_ms": (r.get("e2e_error") or {}).get("p99_ms"),
            "client_cpu_us_per_request": r.get("client_cpu_us_per_request"),
            "server_cpu_us_per_request": r.get("server_cpu_us_per_request"),
            "cpu_wait_ms": (r.get("cpu_wait_ms") or {}).get("total"),
            "load_avg_1m": r.get("load_avg_1m"),
        }
        for r in runs
    ]
    return best


def cases(quick: bool) -> list[tuple[str, list[str]]]:
    per = ["--requests-per-stream", "2" if quick else "4"]
    out: list[tuple[str, list[str]]] = []
    for streams in (1, 64, 256):
        out.append((f"chat {streams}", ["--streams", str(streams), *per]))
    for streams in (64, 256):  # the load thread at real-time priority: not descheduled
        out.append((f"chat {streams}, realtime", ["--streams", str(streams), *per, "--realtime"]))
    out.append(("completions 64", ["--endpoint", "completions", "--streams", "64", *per]))
    for surface in ("responses", "anthropic-messages"):  # semantic events (issue 25 part 3)
        for streams in (1, 64):
            case = ["--endpoint", surface, "--streams", str(streams), *per]
            out.append((f"{surface} {streams}", case))
        out.append((f"{surface} 64, realtime", [*case, "--realtime"]))
    answer = ["--ttft-ms", "5", *per]
    for streams in (1, 64):
        for batch in (1, 16):
            out.append(
                (
                    f"embeddings batch {batch}, {streams}",
                    ["--endpoint", "embeddings", "--batch-size", str(batch),
                     "--streams", str(streams), *answer],
                )
            )  # fmt: skip
        for api in ("rerank", "cohere", "score", "tei"):
            out.append(
                (
                    f"rerank {api}, {streams}",
                    ["--endpoint", "rerank", "--rerank-api", api, "--streams", str(streams),
                     *answer],
                )
            )  # fmt: skip
    fast = ["--endpoint", "embeddings", "--ttft-ms", "0", "--input-len", "8", "--streams", "64"]
    fast += ["--requests-per-stream", "100" if quick else "300", *PIN]
    out.append(("embeddings throughput", fast))
    out.append(("embeddings throughput, realtime", [*fast, "--realtime"]))
    return out


def row(name: str, r: dict[str, Any]) -> str:
    err = r.get("e2e_error") or r.get("ttft_error") or {}
    kind = "E2E" if "e2e_error" in r else "TTFT"
    rate = r.get("request_throughput_req_s")
    cpu = r.get("client_cpu_us_per_request")
    sim = r.get("server_cpu_us_per_request")
    return (
        f"| {name} | {r.get('clock_source')} | {kind} | {r.get('compared')} | "
        f"{_ms(err.get('p50_ms'))} | {_ms(err.get('p99_ms'))} | {_ms(err.get('max_ms'))} | "
        f"{'—' if rate is None else f'{rate:,.0f}'} | {'—' if cpu is None else f'{cpu:.0f}'} | "
        f"{'—' if sim is None else f'{sim:.0f}'} | "
        f"{(r.get('cpu_wait_ms') or {}).get('total') or 0:.0f} | {r['load_avg_1m']:.2f} |"
    )


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v:.3f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="+", default=None, help="cases starting with these words")
    ap.add_argument("--out", default=str(HERE / "results" / "fidelity_surfaces.json"), type=Path)
    args = ap.parse_args()
    results: dict[str, Any] = {}
    if args.only and args.out.exists():
        results = json.loads(args.out.read_text())
    for name, case in cases(args.quick):
        if args.only and not name.startswith(tuple(args.only)):
            continue
        try:
            results[name] = (
                repeated(case) if name.startswith("embeddings throughput") else (fidelity(case))
            )
        except subprocess.CalledProcessError as e:  # e.g. real-time priority refused
            results[name] = {"args": case, "error": (e.stderr or "").strip()[-300:]}
        print(name, json.dumps(results[name].get("e2e_error") or results[name].get("ttft_error")))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        "| case | clock | error of | compared | p50 ms | p99 ms | max ms | req/s | client CPU "
        "µs/req | simulator CPU µs/req | CPU wait ms | load avg |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [row(n, r) for n, r in results.items() if "error" not in r]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
