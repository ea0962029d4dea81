"""Run every benchmark and write its figures to benchmarks/results/.

    python benchmarks/run_all.py            # everything (a few minutes on 2 cores)
    python benchmarks/run_all.py --quick    # fewer repetitions

(a) client fidelity: TTFT and chunk-gap error against the simulator's ground truth at 1, 64,
    256 and 1024 concurrent streams (128 tokens, ITL 10 ms), kernel and user-space stamps;
(b) client capacity: the most streamed tokens/s with chunk-gap error p99 <= 1 ms;
(c) storage: ingest and full report of 10,000 requests x 1,000 tokens, SQLite and PostgreSQL;
(d) pages, when benchmarks/bench_pages.py exists: render time of a 1M-event run page.

Results: fidelity.json, capacity.json, storage.json, pages.json and summary.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def run_json(args: list[str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, *args], check=True, capture_output=True, text=True, cwd=HERE.parent
    ).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def fidelity_case(streams: int, userspace: bool, itl_ms: float = 10.0) -> dict[str, Any]:
    args = [
        str(HERE / "bench_client_fidelity.py"),
        "--streams", str(streams),
        "--itl-ms", str(itl_ms),
        "--output-len", "128",
        "--sim-cpus", "1",
        "--client-cpus", "0",
        "--json",
    ]  # fmt: skip
    if userspace:
        args.append("--userspace")
    return run_json(args)


def worst_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The repetition with the largest TTFT error p99 (we report the worst, not the best)."""
    return max(runs, key=lambda r: r["ttft_error"]["p99_ms"] or 0.0)


def fidelity(reps: int) -> list[dict[str, Any]]:
    rows = []
    for userspace in (False, True):
        for streams in (1, 64, 256, 1024):
            runs = [fidelity_case(streams, userspace) for _ in range(reps)]
            row = worst_of(runs)
            row["repetitions"] = reps
            rows.append(row)
            print(
                f"fidelity {'user' if userspace else 'kernel':6} {streams:5} streams: TTFT err "
                f"p99 {row['ttft_error']['p99_ms']:.3f} ms, gap err p99 "
                f"{row['chunk_gap_error']['p99_ms']:.3f} ms",
                flush=True,
            )
    return rows


def capacity() -> dict[str, Any]:
    """Streamed tokens/s (1 token per event) one client sustains with gap error p99 <= 1 ms.

    The simulator runs on the other core and saturates near 500-600 streams at 10 ms ITL on
    this 2-core machine, so 1024 streams are also measured at 20 ms ITL."""
    steps = []
    best: dict[str, Any] | None = None
    for streams, itl in ((256, 10.0), (512, 10.0), (768, 10.0), (1024, 10.0), (1024, 20.0)):
        row = fidelity_case(streams, userspace=False, itl_ms=itl)
        ok = (row["chunk_gap_error"]["p99_ms"] or 0.0) <= 1.0 and row["ok"] == streams
        row["meets_1ms"] = ok
        row["tokens_per_s"] = streams * 1000.0 / itl
        steps.append(row)
        print(
            f"capacity {streams:5} streams @ {itl:g} ms: {row['tokens_per_s']:,.0f} tok/s, gap "
            f"err p99 {row['chunk_gap_error']['p99_ms']:.3f} ms {'ok' if ok else 'over'}",
            flush=True,
        )
        if ok and (best is None or row["tokens_per_s"] > best["tokens_per_s"]):
            best = row
    return {
        "steps": steps,
        "max_tokens_per_s_within_1ms": best["tokens_per_s"] if best else None,
        "max_streams_within_1ms": max(
            (r["streams"] for r in steps if r["meets_1ms"]), default=None
        ),
    }


def fmt(v: Any) -> str:
    return "—" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def summary_md(
    fid: list[dict[str, Any]],
    cap: dict[str, Any],
    storage: dict[str, Any],
    pages: dict[str, Any] | None,
) -> str:
    lines = [
        "# Benchmark figures",
        "",
        "## (a) Client fidelity (worst of the repetitions)",
        "",
        "| clock | streams | TTFT err p50 | p99 | max | chunk-gap err p50 | p99 | max "
        "| all streams active |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in fid:
        t, g = r["ttft_error"], r["chunk_gap_error"]
        lines.append(
            f"| {r['clock_source']} | {r['streams']} | {fmt(t['p50_ms'])} | {fmt(t['p99_ms'])} | "
            f"{fmt(t['max_ms'])} | {fmt(g['p50_ms'])} | {fmt(g['p99_ms'])} | {fmt(g['max_ms'])} | "
            f"{r['all_streams_active_together']} |"
        )
    lines += [
        "",
        "## (b) Client capacity (kernel stamps, one token per event)",
        "",
        f"Most streamed tokens/s within 1 ms p99 gap error: {cap['max_tokens_per_s_within_1ms']}",
        "",
        "| streams | ITL ms | streamed tok/s | TTFT err p99 ms | chunk-gap err p99 ms | ok |",
        "|---|---|---|---|---|---|",
    ]
    for r in cap["steps"]:
        lines.append(
            f"| {r['streams']} | {r['itl_ms']:g} | {r['tokens_per_s']:,.0f} | "
            f"{fmt(r['ttft_error']['p99_ms'])} | {fmt(r['chunk_gap_error']['p99_ms'])} | "
            f"{r['meets_1ms']} |"
        )
    lines += [
        "",
        "## (c) Storage (10,000 requests x 1,000 tokens)",
        "",
        "| backend | ingest s | events/s | load s | metrics s | full report s |",
        "|---|---|---|---|---|---|",
    ]
    for name, b in storage.get("backends", {}).items():
        lines.append(
            f"| {name} | {fmt(b['ingest_s'])} | {b['ingest_events_per_s']:,.0f} | "
            f"{fmt(b['load_warm_s'])} | {fmt(b.get('compute_metrics_s'))} | "
            f"{fmt(b.get('full_report_s'))} |"
        )
    if pages:
        lines += ["", "## (d) Pages", "", "```", json.dumps(pages, indent=2), "```"]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one repetition per case")
    args = ap.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    fid = fidelity(1 if args.quick else 3)
    (RESULTS / "fidelity.json").write_text(json.dumps(fid, indent=2))
    cap = capacity()
    (RESULTS / "capacity.json").write_text(json.dumps(cap, indent=2))
    subprocess.run(
        [
            sys.executable,
            str(HERE / "bench_storage.py"),
            "--sqlite",
            "--postgres",
            "--out",
            str(RESULTS / "storage.json"),
        ],
        check=True,
        cwd=HERE.parent,
    )
    storage = json.loads((RESULTS / "storage.json").read_text())
    pages = None
    if (HERE / "bench_pages.py").exists():
        subprocess.run([sys.executable, str(HERE / "bench_pages.py")], check=True, cwd=HERE.parent)
        pages_file = RESULTS / "pages.json"
        pages = json.loads(pages_file.read_text()) if pages_file.exists() else None
    (RESULTS / "summary.md").write_text(summary_md(fid, cap, storage, pages))
    print((RESULTS / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
