"""A session's next turn never reaches the server before the previous response has ended on
the wire (SPEC 3b, issue 24 item 6): a scripted server sends ``data: [DONE]``, waits, then
ends the response (the chunked terminator, the rest of a Content-Length body, or its close),
and records with the kernel's receive stamps when each request's first byte arrived. The
independent check is the server's own timeline: every next turn's first byte arrives after
the moment the server began writing the previous response's end."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from app.client.clocks import kernel_stamps_supported
from app.client.http_stream import DONE_GRACE_S
from app.client.runner import run_load
from app.client.spec import RunSpec
from app.domain import RequestStatus
from tests.test_client import run

pytestmark = pytest.mark.skipif(
    not kernel_stamps_supported(), reason="the server's receive stamps need Linux"
)

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
DELAY_S = 0.08  # between "[DONE]" and the response's end
LATE_S = DONE_GRACE_S + 0.3  # ... for a server that ends it too late


def _event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _events(rid: str, n: int) -> list[bytes]:
    out = [_event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})]
    for i in range(n):
        text = (" " if i else "") + f"{rid}-{i}"
        out.append(_event({"choices": [{"index": 0, "delta": {"content": text}}]}))
    out.append(_event({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": n}}))
    return [*out, b"data: [DONE]\n\n"]


@dataclass
class Timeline:
    """What the server saw: each request's first byte (kernel receive stamp, realtime ns) and
    when it began writing each response's end (realtime ns), by X-Request-Id."""

    first_byte: dict[str, int] = field(default_factory=dict)
    end_written: dict[str, int] = field(default_factory=dict)
    connections: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def _read_request(conn: socket.socket) -> tuple[dict[str, str], dict[str, Any], int] | None:
    """One request: (headers, JSON body, kernel receive stamp of its first byte); None at
    EOF."""
    data = b""
    stamp = 0
    while b"\r\n\r\n" not in data:
        chunk, anc, _flags, _addr = conn.recvmsg(65536, 1024)
        if not chunk:
            return None
        if not data:
            for level, typ, cdata in anc:
                if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS:
                    sec, nsec = struct.unpack("qq", cdata[:16])
                    stamp = sec * 1_000_000_000 + nsec
            stamp = stamp or time.time_ns()
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    headers = {}
    for line in head.decode().split("\r\n")[1:]:
        k, v = line.split(":", 1)
        headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", "0"))
    while len(body) < n:
        more = conn.recv(65536)
        if not more:
            return None
        body += more
    return headers, json.loads(body), stamp


def _serve(conn: socket.socket, framing: str, tl: Timeline) -> None:
    """Answer requests on ``conn``: every event, "[DONE]", then after ``DELAY_S`` the end."""
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    with conn:
        while True:
            got = _read_request(conn)
            if got is None:
                return
            headers, body, stamp = got
            rid = headers["x-request-id"]
            with tl.lock:
                tl.first_byte[rid] = stamp
            events = _events(rid, int(body["max_tokens"]))
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            if framing in ("chunked", "chunked-close", "chunked-late"):
                if framing == "chunked-close":
                    head += b"connection: close\r\n"
                conn.sendall(head + b"transfer-encoding: chunked\r\n\r\n")
                for e in events:
                    conn.sendall(b"%x\r\n%b\r\n" % (len(e), e))
                end = b"0\r\n\r\n"
            elif framing == "length":
                tail = b": the body goes on after [DONE]\n\n"
                total = sum(len(e) for e in events) + len(tail)
                conn.sendall(head + b"content-length: %d\r\n\r\n" % total)
                for e in events:
                    conn.sendall(e)
                end = tail
            else:  # "close": no framing, the body ends where the server closes
                conn.sendall(head + b"\r\n")
                for e in events:
                    conn.sendall(e)
                end = b""
            time.sleep(LATE_S if framing == "chunked-late" else DELAY_S)
            with tl.lock:
                tl.end_written[rid] = time.time_ns()
            if end:
                conn.sendall(end)
            if framing in ("chunked-close", "close"):
                conn.shutdown(socket.SHUT_WR)
                return


@pytest.fixture
def server() -> Iterator[Any]:
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.1)
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(framing: str) -> tuple[str, Timeline]:
        tl = Timeline()

        def accept() -> None:
            while not stop.is_set():
                try:
                    conn, _ = srv.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return
                tl.connections += 1
                t = threading.Thread(target=_guard, args=(conn, framing, tl), daemon=True)
                t.start()
                threads.append(t)

        t = threading.Thread(target=accept, daemon=True)
        t.start()
        threads.append(t)
        return f"http://127.0.0.1:{srv.getsockname()[1]}", tl

    yield start
    stop.set()
    srv.close()
    for t in threads:
        t.join(timeout=2)


def _guard(conn: socket.socket, framing: str, tl: Timeline) -> None:
    with contextlib.suppress(OSError):  # the client closed a connection it gave up on
        _serve(conn, framing, tl)


def _spec(url: str, tmp_path: Path, turns: int = 3, **kw: Any) -> RunSpec:
    p = tmp_path / "conv.jsonl"
    conv = ["a", "b", "c"][:turns]
    p.write_text("".join(json.dumps({"turns": conv}) + "\n" for _ in range(2)))
    base: dict[str, Any] = {
        "base_url": url,
        "model": "m",
        "dataset": "jsonl",
        "dataset_path": str(p),
        "multi_turn": True,
        "output_len": 3,
        "num_prompts": 2,
        "request_timeout_s": 5.0,
        "scrape_metrics": False,
    }
    return RunSpec(**(base | kw))


@pytest.mark.parametrize(
    ("framing", "mode", "think_ms"),
    [
        ("chunked", "keep-alive", 0.0),  # the next turn from the read callback
        ("chunked", "keep-alive", 5.0),  # ... from the session's task
        ("chunked", "new", 0.0),
        ("chunked-close", "keep-alive", 0.0),
        ("length", "keep-alive", 0.0),
        ("close", "keep-alive", 0.0),
    ],
)
def test_next_turn_leaves_after_the_response_ended_on_the_wire(
    server: Any, tmp_path: Path, framing: str, mode: str, think_ms: float
) -> None:
    url, tl = server(framing)
    spec = _spec(url, tmp_path, connection_mode=mode, turn_delay_ms=think_ms)
    res = run(run_load(spec, run_tag="w"))
    recs = sorted(res.records, key=lambda r: (r.session, r.turn))
    assert [(r.session, r.turn) for r in recs] == [(s, t) for s in (0, 1) for t in (1, 2, 3)]
    assert all(r.status is RequestStatus.OK for r in recs), [r.error for r in recs]
    assert all(r.output_tokens == 3 for r in recs)
    for s in (0, 1):
        for k in (1, 2):
            prev, nxt = f"w-s{s}-t{k}", f"w-s{s}-t{k + 1}"
            # the server's own clock: the next request's first byte came in after the
            # server began writing the previous response's end (missing: the run was over
            # before the server wrote it)
            assert prev in tl.end_written, f"{nxt} was sent before {prev} ended"
            assert tl.first_byte[nxt] > tl.end_written[prev], (prev, nxt)
    if framing == "chunked" and mode == "keep-alive":  # one connection per session
        assert tl.connections == 2
    # the records say the same: each next turn was due where its reply's response ended,
    # and left at or after it
    by = {(r.session, r.turn): r for r in recs}
    for (s, t), r in by.items():
        if t == 1:
            continue
        before = by[(s, t - 1)]
        assert before.end_ns is not None and r.sent_ns is not None
        assert r.scheduled_ns == before.end_ns + int(think_ms * 1e6)
        assert r.sent_ns >= r.scheduled_ns
        # the reply's end is its response's end, not its "[DONE]" (DELAY_S before it)
        assert before.done_ns is not None
        assert before.end_ns - before.done_ns >= DELAY_S * 1e9 * 0.5


def test_a_body_that_never_ends_is_closed_before_the_next_turn(server: Any, tmp_path: Path) -> None:
    """The terminator comes ``LATE_S`` after "[DONE]", past ``DONE_GRACE_S``: the turn is
    complete (OK, ended at its "[DONE]"), its connection is closed unfinished, and the next
    turn is due from that moment, not from the "[DONE]" (its send lag is not the grace)."""
    url, tl = server("chunked-late")
    res = run(run_load(_spec(url, tmp_path, turns=2, num_prompts=1), run_tag="g"))
    recs = sorted(res.records, key=lambda r: r.turn or 0)
    assert [r.turn for r in recs] == [1, 2]
    assert all(r.status is RequestStatus.OK for r in recs), [r.error for r in recs]
    first, second = recs
    assert first.done_ns is not None and first.end_ns == first.done_ns
    assert second.scheduled_ns >= first.done_ns + DONE_GRACE_S * 1e9
    assert second.sent_ns is not None and second.sent_ns >= second.scheduled_ns
    # on a new connection: the client closed the first one, its response unfinished
    assert second.conn_reused is False and tl.connections == 2


def test_a_timeout_after_done_keeps_the_complete_stream(server: Any) -> None:
    """The request timeout (0.3 s) comes while the body's end is awaited after "[DONE]": the
    stream was complete, so the request is OK (ended at its "[DONE]"), not a timeout."""
    url, _ = server("chunked-late")
    spec = RunSpec(
        base_url=url, model="m", input_len=8, output_len=3, num_prompts=1,
        request_timeout_s=0.3, scrape_metrics=False,
    )  # fmt: skip
    res = run(run_load(spec, run_tag="t"))
    (rec,) = res.records
    assert rec.status is RequestStatus.OK, rec.error
    assert rec.output_tokens == 3 and rec.end_ns == rec.done_ns
