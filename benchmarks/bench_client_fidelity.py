"""How exactly does the tokentrace client measure? Compare it with the simulator's ground truth.

The simulator (its own process, optionally pinned to other CPUs) stamps each request's first
byte with the kernel's receive stamp (``SO_TIMESTAMPNS`` on its accepted sockets) and every
SSE event with ``time.monotonic_ns()`` right before writing it; the client records when its
request's first byte left (kernel transmit stamp) and when each event arrived (kernel
receive stamps, or user-space stamps with ``--userspace``). All are the host's monotonic
clock.

Reported (ms):
* TTFT error = client TTFT - the server's TTFT of the same request (its send of the first
  content - its kernel receive stamp of the request's first byte): what a user reads,
  against a truth that is not the client's code path. The send is when the simulator's send
  syscall began (TLS: after encrypting); the error against its stamp before the write call
  and against the write's return are reported too (the send lies between them). Signed bias
  and |error| percentiles.
* first-token delivery lag = client arrival of the first content - the server's write of it
  (loopback delivery plus the client's receive-side error; not TTFT error).
* chunk gap error (client gap - server gap for consecutive content events), per-event
  offset, streams all active at once, connections (the client's and the server's count),
  the client's CPU per streamed token, and the client's own health numbers.
* For a surface that answers once (``--endpoint embeddings`` / ``rerank``): E2E error =
  client E2E (the answer's arrival - its first byte's send) - the server's E2E (its send
  syscall of the answer - its kernel receive stamp of the request's first byte), and the
  achieved request throughput (requests / the window from the first send to the last
  answer) with the client's CPU per request.

    python benchmarks/bench_client_fidelity.py --streams 256 --itl-ms 10 --output-len 100
    python benchmarks/bench_client_fidelity.py --streams 1000 --sim-cpus 1 --client-cpus 0
    python benchmarks/bench_client_fidelity.py --streams 256 --userspace --realtime
    python benchmarks/bench_client_fidelity.py --streams 256 --tls     # https, kernel stamps
    python benchmarks/bench_client_fidelity.py --streams 256 --connection-mode new
    python benchmarks/bench_client_fidelity.py --endpoint embeddings --batch-size 16
    python benchmarks/bench_client_fidelity.py --endpoint rerank --rerank-api score
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.client.runner import run_load_sync
from app.client.spec import RunSpec
from app.domain import EventKind, RequestStatus
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_process


def pct(a: np.ndarray, p: float) -> float | None:
    return float(np.percentile(a, p)) if a.size else None


def summary(a_ns: list[int]) -> dict[str, float | None]:
    a = np.abs(np.asarray(a_ns, np.float64)) / 1e6
    return {
        "p50_ms": pct(a, 50),
        "p99_ms": pct(a, 99),
        "max_ms": float(a.max()) if a.size else None,
    }


def throwaway_certificate(d: Path) -> dict[str, str]:
    """A self-signed certificate for 127.0.0.1 (also its own trust anchor), via openssl."""
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "key.pem", "-out", "cert.pem",
            "-days", "1", "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1",
            "-addext", "basicConstraints=critical,CA:TRUE",
        ],
        cwd=d, check=True, capture_output=True,
    )  # fmt: skip
    return {"tls_certfile": str(d / "cert.pem"), "tls_keyfile": str(d / "key.pem")}


def cpus(arg: str | None) -> set[int] | None:
    return {int(c) for c in arg.split(",")} if arg else None


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used, from ``/proc`` (0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rerank_dataset(d: Path, lines: int, documents: int) -> str:
    """A JSONL file of ``lines`` queries with ``documents`` short documents each."""
    path = d / "pairs.jsonl"
    with path.open("w") as f:
        for i in range(lines):
            docs = [f"document {j} of query {i} about the topic" for j in range(documents)]
            f.write(json.dumps({"query": f"query {i} about the topic", "documents": docs}) + "\n")
    return str(path)


def answer_errors(res: Any, gt: dict[str, Any], tag: str) -> tuple[list[int], int]:
    """E2E errors (ns) of the answers the client and the server both saw, and how many."""
    errors: list[int] = []
    for r in res.records:
        g = gt.get(f"{tag}-{r.index}")
        if g is None or r.status is not RequestStatus.OK or r.sent_ns is None:
            continue
        kinds = g["events"]["kind"]
        if kinds != ["response"] or r.event_kind.tolist() != [EventKind.ANSWER]:
            continue
        client_e2e = int(r.event_t_ns[0]) - r.sent_ns
        sent_at = int(g.get("first_content_send_ns") or g["events"]["t_ns"][0])
        errors.append(client_e2e - (sent_at - int(g["first_byte_rx_ns"])))
    return errors, len(errors)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--output-len", type=int, default=100)
    ap.add_argument("--tokens-per-event", type=int, default=1)
    ap.add_argument("--userspace", action="store_true", help="disable kernel receive stamps")
    ap.add_argument(
        "--realtime", action="store_true", help="run the load thread at SCHED_FIFO priority"
    )
    ap.add_argument("--tls", action="store_true", help="https: a throwaway certificate (openssl)")
    ap.add_argument(
        "--requests-per-stream", type=int, default=4, help="requests each stream sends in turn"
    )
    ap.add_argument("--connection-mode", default="keep-alive", choices=("keep-alive", "new"))
    ap.add_argument("--sim-cpus", help="pin the simulator, e.g. 1")
    ap.add_argument("--client-cpus", help="pin this client process, e.g. 0")
    ap.add_argument("--json", action="store_true", help="print JSON only")
    ap.add_argument(
        "--endpoint",
        default="chat",
        choices=("chat", "completions", "embeddings", "rerank", "responses", "anthropic-messages"),
    )
    ap.add_argument("--batch-size", type=int, default=1, help="embeddings: inputs a request")
    ap.add_argument("--input-len", type=int, default=32, help="tokens a prompt (an input)")
    ap.add_argument("--rerank-api", default="rerank", help="rerank: rerank|cohere|score|tei")
    ap.add_argument("--documents", type=int, default=8, help="rerank: documents a query")
    args = ap.parse_args()
    answers = args.endpoint in ("embeddings", "rerank")

    if args.client_cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus(args.client_cpus) or set())
    tls: dict[str, str] = {}
    if args.tls:
        tls = throwaway_certificate(Path(tempfile.mkdtemp(prefix="tt-fid-tls-")))
        os.environ["SSL_CERT_FILE"] = tls["tls_certfile"]  # the client trusts it
    cfg = SimConfig(
        ttft_ms=args.ttft_ms,
        itl_ms=args.itl_ms,
        tokens_per_event=args.tokens_per_event,
        output_len=args.output_len,
        **tls,
    )
    tag = "fid" + uuid.uuid4().hex[:6]
    surface: dict[str, Any] = {"endpoint": args.endpoint}
    if args.endpoint == "embeddings":
        surface["endpoint_options"] = {"batch_size": args.batch_size}
    elif args.endpoint == "rerank":
        d = Path(tempfile.mkdtemp(prefix="tt-fid-rerank-"))
        surface |= {
            "endpoint_options": {"rerank_api": args.rerank_api},
            "dataset": "jsonl",
            "dataset_path": rerank_dataset(d, 64, args.documents),
        }
    with start_simulator_process(cfg, cpus=cpus(args.sim_cpus)) as sim:
        spec = RunSpec(
            base_url=sim.base_url,
            model="sim",
            input_len=args.input_len,
            output_len=args.output_len,
            num_prompts=args.streams * args.requests_per_stream,
            max_concurrency=args.streams,
            request_timeout_s=120,
            connection_mode=args.connection_mode,
            scrape_metrics=False,
            **surface,
        )
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        sim_cpu0 = process_cpu_s(sim.pid)
        res = run_load_sync(
            spec, run_tag=tag, kernel_stamps=not args.userspace, realtime=args.realtime
        )
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        sim_cpu_s = process_cpu_s(sim.pid) - sim_cpu0
        truth = sim.ground_truth()
        gt = truth["requests"]
    client_cpu_s = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    if answers:
        report = answers_report(args, spec, res, truth, tag, client_cpu_s, sim_cpu_s)
        print(json.dumps(report, indent=None if args.json else 2))
        return 0
    tokens = sum(r.output_tokens or 0 for r in res.records if r.status is RequestStatus.OK)

    ttft_err: list[int] = []
    ttft_err_warm: list[int] = []  # requests on a connection an earlier request had opened
    ttft_err_end: list[int] = []  # against the server's first content write having returned
    ttft_err_call: list[int] = []  # against the server's stamp before its write call
    delivery: list[int] = []
    gap_err: list[int] = []
    offset: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    for r in res.records:
        g = gt.get(f"{tag}-{r.index}")
        if g is None or r.status is not RequestStatus.OK:
            continue
        ev = g["events"]
        server = np.asarray(
            [t for t, k in zip(ev["t_ns"], ev["kind"], strict=True) if k == "content"], np.int64
        )
        client = r.event_t_ns[r.event_kind == EventKind.CONTENT] + res.start_mono_ns
        if server.size != client.size or server.size == 0 or r.sent_ns is None:
            continue
        client_ttft = int(client[0]) - (r.sent_ns + res.start_mono_ns)
        rx = int(g["first_byte_rx_ns"])
        # the server's send of the first content: its send syscall (TLS: after encrypting),
        # else its stamp before the write call
        sent_at = int(g.get("first_content_send_ns") or server[0])
        err = client_ttft - (sent_at - rx)
        ttft_err.append(err)
        if r.conn_reused:
            ttft_err_warm.append(err)
        ttft_err_call.append(client_ttft - (int(server[0]) - rx))
        if g.get("first_content_written_ns"):
            ttft_err_end.append(client_ttft - (int(g["first_content_written_ns"]) - rx))
        delivery.append(int(client[0]) - sent_at)
        gap_err.extend((np.diff(client) - np.diff(server)).tolist())
        offset.extend((client - server).tolist())
        starts.append(int(client[0]))
        ends.append(int(client[-1]))
    # the most requests streaming at once (between their first and last content event)
    marks = sorted([(t, 1) for t in starts] + [(t, -1) for t in ends])
    together = peak = 0
    for _t, step in marks:
        together += step
        peak = max(peak, together)
    all_active = peak >= args.streams
    out: dict[str, Any] = {
        "streams": args.streams,
        "itl_ms": args.itl_ms,
        "tokens_per_event": args.tokens_per_event,
        "clock_source": res.clock_source.value,
        "tls": args.tls,
        "scheduling": res.scheduling.policy,
        "ok": res.counts["ok"],
        "compared": len(ttft_err),
        "all_streams_active_together": all_active,
        "max_streaming_together": peak,
        "connection_mode": args.connection_mode,
        "requests": spec.num_prompts,
        "connections_client": res.connections,
        # the ground-truth fetch itself is one more connection
        "connections_server": int(truth.get("connections_accepted", 0)) - 1,
        "send_clock_source": res.send_clock_source.value,
        "server_rx_clock": sorted({str(g.get("rx_clock")) for g in gt.values()}),
        "ttft_error": summary(ttft_err),
        "ttft_bias_ms": float(np.mean(ttft_err)) / 1e6 if ttft_err else None,
        "ttft_error_warm": summary(ttft_err_warm),
        "ttft_bias_warm_ms": float(np.mean(ttft_err_warm)) / 1e6 if ttft_err_warm else None,
        # the server's send lies between its stamp before the write and the write's return:
        # this is the error's other bound (negative: the client saw it before write returned)
        "ttft_bias_vs_write_end_ms": float(np.mean(ttft_err_end)) / 1e6 if ttft_err_end else None,
        "ttft_bias_vs_write_call_ms": float(np.mean(ttft_err_call)) / 1e6
        if ttft_err_call
        else None,
        "first_token_delivery_lag": summary(delivery),
        "client_cpu_us_per_token": client_cpu_s * 1e6 / tokens if tokens else None,
        "chunk_gap_error": summary(gap_err),
        "event_offset": summary(offset),
        "send_lag_ms": {"p99": res.send_lag.p99_ms, "max": res.send_lag.max_ms},
        "loop_lag_ms": {"p99": res.loop_lag.p99_ms, "max": res.loop_lag.max_ms},
        "read_delay_ms": {"p99": res.read_delay.p99_ms, "max": res.read_delay.max_ms},
        "cpu_wait_ms": {"total": res.cpu_wait_total_ms, "max_per_tick": res.cpu_wait.max_ms},
        "client_limited": res.client_limited,
        "client_limited_reasons": res.client_limited_reasons,
        "notes": res.notes,
    }
    print(json.dumps(out, indent=None if args.json else 2))
    return 0


def answers_report(
    args: argparse.Namespace,
    spec: RunSpec,
    res: Any,
    truth: dict[str, Any],
    tag: str,
    client_cpu_s: float,
    sim_cpu_s: float,
) -> dict[str, Any]:
    """The figures of a surface that answers once (embeddings, rerank)."""
    errors, compared = answer_errors(res, truth["requests"], tag)
    ok = [r for r in res.records if r.status is RequestStatus.OK and r.sent_ns is not None]
    first = min((r.sent_ns for r in ok), default=0)
    last = max((int(r.event_t_ns[-1]) for r in ok if r.event_t_ns.size), default=0)
    window_s = (last - first) / 1e9 if last > first else None
    e2e = [(int(r.event_t_ns[0]) - r.sent_ns) / 1e6 for r in ok if r.event_t_ns.size]
    return {
        "endpoint": args.endpoint,
        "endpoint_options": spec.endpoint_options,
        "streams": args.streams,
        "answer_latency_ms": args.ttft_ms,
        "clock_source": res.clock_source.value,
        "send_clock_source": res.send_clock_source.value,
        "server_rx_clock": sorted({str(g.get("rx_clock")) for g in truth["requests"].values()}),
        "requests": spec.num_prompts,
        "ok": res.counts["ok"],
        "compared": compared,
        "e2e_error": summary(errors),
        "e2e_bias_ms": float(np.mean(errors)) / 1e6 if errors else None,
        "e2e_ms": {"p50": pct(np.asarray(e2e), 50), "p99": pct(np.asarray(e2e), 99)},
        "request_throughput_req_s": len(ok) / window_s if window_s else None,
        "items_per_s": sum(int(r.event_tokens.sum()) for r in ok) / window_s if window_s else None,
        "client_cpu_us_per_request": client_cpu_s * 1e6 / len(ok) if ok else None,
        # the simulator's CPU over the same span: which side of the loopback is the limit
        "server_cpu_us_per_request": sim_cpu_s * 1e6 / len(ok) if ok else None,
        "connections_client": res.connections,
        "send_lag_ms": {"p99": res.send_lag.p99_ms, "max": res.send_lag.max_ms},
        "loop_lag_ms": {"p99": res.loop_lag.p99_ms, "max": res.loop_lag.max_ms},
        "cpu_wait_ms": {"total": res.cpu_wait_total_ms, "max_per_tick": res.cpu_wait.max_ms},
        "client_limited": res.client_limited,
        "client_limited_reasons": res.client_limited_reasons,
        "load_avg_1m": os.getloadavg()[0],
        "notes": res.notes,
    }


if __name__ == "__main__":
    raise SystemExit(main())
