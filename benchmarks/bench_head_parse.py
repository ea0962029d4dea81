"""The response head parser: tokentrace's hand-written one against h11 fed the same bytes.

    python benchmarks/bench_head_parse.py [--n 50000] [--out benchmarks/results/head_parse.json]

Issue 15 asks whether the hand-written HTTP head parser (``app.client.http_response.parse_head``)
earns its place over h11 (a dependency already). A stream's head is parsed once, in the read
callback that completes it, so its cost is added to the client's processing of that read:
it delays nothing stamped by the kernel, but it is CPU time on the measurement loop right
before the first token. Measured here: microseconds per head (median of 7 rounds of ``n``
parses) for the heads of llama.cpp, vLLM-style and chunked SSE responses, both parsers on
the same bytes, and that both read the same status and headers.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import h11

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.client.http_response import parse_head  # the parser in use

HEADS = {
    "llama.cpp SSE": (
        b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5, max=100\r\nContent-Type: text/event-stream"
        b"\r\nServer: llama.cpp\r\nTransfer-Encoding: chunked\r\nAccess-Control-Allow-Origin: "
        b"\r\n\r\n"
    ),
    "uvicorn (vLLM) SSE": (
        b"HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 22:00:00 GMT\r\nserver: uvicorn\r\n"
        b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n"
        b"x-request-id: 3f2a9c1b\r\n\r\n"
    ),
    "JSON error": (
        b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 93\r\n"
        b"connection: keep-alive\r\n\r\n"
    ),
}
REQUEST = h11.Request(method="POST", target="/v1/chat/completions", headers=[("Host", "x")])


def ours(head: bytes) -> tuple[int, dict[bytes, bytes]]:
    return parse_head(head[:-4])  # the caller passes the head without its blank line


def with_h11(head: bytes) -> tuple[int, dict[bytes, bytes]]:
    conn = h11.Connection(h11.CLIENT)
    conn.send(REQUEST)
    conn.receive_data(head)
    ev = conn.next_event()
    assert isinstance(ev, h11.Response)
    return ev.status_code, {bytes(k): bytes(v) for k, v in ev.headers}


def h11_read_only(conn: h11.Connection, head: bytes) -> tuple[int, dict[bytes, bytes]]:
    """h11's part on a connection whose request was already sent (as a kept-alive one)."""
    conn.receive_data(head)
    ev = conn.next_event()
    assert isinstance(ev, h11.Response)
    return ev.status_code, {bytes(k): bytes(v) for k, v in ev.headers}


def per_call_us(fn: object, head: bytes, n: int) -> float:
    rounds = []
    for _ in range(7):
        t = time.perf_counter_ns()
        for _ in range(n):
            fn(head)  # type: ignore[operator]
        rounds.append((time.perf_counter_ns() - t) / n / 1000)
    return statistics.median(rounds)


def h11_read_us(head: bytes, n: int) -> float:
    """h11's parse alone: connections prepared (request sent) outside the timing."""
    rounds = []
    for _ in range(7):
        conns = []
        for _ in range(n):
            c = h11.Connection(h11.CLIENT)
            c.send(REQUEST)
            conns.append(c)
        t = time.perf_counter_ns()
        for c in conns:
            h11_read_only(c, head)
        rounds.append((time.perf_counter_ns() - t) / n / 1000)
    return statistics.median(rounds)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/head_parse.json"))
    a = ap.parse_args()
    rows = {}
    for name, head in HEADS.items():
        s1, h1 = ours(head)
        s2, h2 = with_h11(head)
        assert s1 == s2 and h1 == h2, name  # the same reading
        rows[name] = {
            "hand_us": round(per_call_us(ours, head, a.n), 3),
            "h11_us": round(per_call_us(with_h11, head, max(a.n // 5, 1)), 3),
            "h11_parse_only_us": round(h11_read_us(head, max(a.n // 5, 1)), 3),
        }
    out = {"python": platform.python_version(), "h11": h11.__version__, "per_head": rows}
    a.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
