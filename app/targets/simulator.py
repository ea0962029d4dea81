"""``tokentrace sim``: a deterministic OpenAI-compatible streaming server and ground truth.

Raw asyncio + h11, no web framework. Every active request is one entry in a single heap of
next-emit deadlines served by ONE scheduler task: no task, no sleep per stream per token.
Each SSE event is written with ``transport.write`` right after ``time.monotonic_ns()`` is
stamped, and the stamp, the deadline it was due at, the event kind and its token count are
kept as ground truth (``GET /_sim/ground_truth``). ``time.monotonic_ns()`` is the clock a
client process on the same host sees, so a client's timings can be checked against it.

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions`` (stream true/false),
``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text, vLLM-like names),
``GET /_sim/ground_truth``, ``POST /_sim/reset``. The timing model and the faults are
described in ``app.targets.sim_config``. With ``tls_certfile``/``tls_keyfile`` it serves
https (asyncio's TLS transport; the stamps are still taken right before ``transport.write``,
which encrypts and hands the bytes to the socket in the same call).

Ground truth JSON: ``{"clock": "monotonic_ns", "pid", "config", "requests": {request_id:
{...}}}`` where request_id is the ``X-Request-Id`` header (or ``sim-<n>``) and each request
has ``seq``, ``endpoint``, ``stream``, ``received_ns``, ``headers_ns``, ``closed_ns``,
``input_tokens``, ``output_tokens`` (planned), ``fault``, ``fault_ns``,
``fault_after_tokens``, ``status`` and columnar ``events``: ``t_ns`` (stamped just before
the write), ``due_ns`` (when the model said it was due), ``kind`` (one of ``EVENT_KINDS``)
and ``tokens``. Events written together in one write share one stamp. ``received_ns`` is
stamped when the read that completed the request returned. Kinds map onto
``app.domain.EventKind``: content -> CONTENT, reasoning -> REASONING, role and finish ->
ROLE, usage -> USAGE, done and malformed -> OTHER.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hashlib
import heapq
import json
import os
import random
import re
import select
import signal
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from time import monotonic_ns
from typing import Any, Protocol

import h11

from app.client.tokenizer import PRETOKEN, WORDS
from app.targets.sim_config import FAULT_ORDER, Fault, SimConfig

__all__ = [
    "EVENT_KINDS",
    "Fault",
    "SimConfig",
    "SimServer",
    "SimulatorHandle",
    "SimulatorProcess",
    "SimulatorThread",
    "build_arg_parser",
    "config_from_args",
    "decide_fault",
    "main",
    "serve",
    "server_ssl_context",
    "start_simulator_process",
    "start_simulator_thread",
]

EVENT_KINDS: tuple[str, ...] = (
    "role",  # role-only chunk (no token)
    "content",  # delta.content / text: token-bearing
    "reasoning",  # delta.reasoning_content: token-bearing
    "finish",  # empty delta with finish_reason (no token)
    "usage",  # choices [] with usage (no token)
    "done",  # data: [DONE]
    "malformed",  # a non-JSON data line (fault)
    "response",  # the whole non-streaming JSON response
    "error",  # an HTTP error response (fault)
)
_K_ROLE, _K_CONTENT, _K_REASONING, _K_FINISH, _K_USAGE, _K_DONE = 0, 1, 2, 3, 4, 5
_K_MALFORMED, _K_RESPONSE, _K_ERROR = 6, 7, 8

_TAPE_BITS = 16
_TAPE_MASK = (1 << _TAPE_BITS) - 1
_SLOT_BITS = 20  # at most ~1M concurrent requests
_SLOT_MASK = (1 << _SLOT_BITS) - 1
_MALFORMED_PAYLOAD = b'data: {"choices": [{"delta": {"content": "unterminated\n\n'
_MALFORMED_FRAME = b"%x\r\n%b\r\n" % (len(_MALFORMED_PAYLOAD), _MALFORMED_PAYLOAD)
_STOP_FAULTS = (Fault.DISCONNECT, Fault.STALL)
_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nserver: tokentrace-sim\r\n"
    b"content-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n"
)
_CLOSE_HEADER = b"connection: close\r\n"
SO_TIMESTAMPNS: int = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("@qq")
_RX_ANCBUF = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0
_DONE_PAYLOAD = b"data: [DONE]\n\n"
_WAITING, _RUNNING, _FINISHED = 0, 1, 2
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def _count_tokens(text: str) -> int:
    """``BuiltinTokenizer().count(text)``, with the matching done in C (long prompts)."""
    return len(PRETOKEN.findall(text))


def _frame(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%b\r\n" % (len(payload), payload)


def _h64(*parts: object) -> int:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _unit(*parts: object) -> float:
    """A deterministic uniform draw in [0, 1) from ``parts``."""
    return _h64(*parts) / 2.0**64


def _json(obj: object) -> bytes:
    return _ENCODER.encode(obj).encode()


def decide_fault(config: SimConfig, seq: int) -> Fault:
    """The fault of the ``seq``-th completion request (1-based), from the seed alone."""
    u = _unit(config.seed, "fault", seq)
    acc = 0.0
    for fault in FAULT_ORDER:
        acc += config.fault_rate(fault)
        if u < acc:
            return fault
    return Fault.NONE


# --------------------------------------------------------------------------- requests


@dataclass(slots=True)
class _Plan:
    """What one completion request asked for, and what the simulator will answer."""

    endpoint: str  # "chat" | "completions"
    stream: bool
    model: str
    input_tokens: int
    output_tokens: int
    reasoning_tokens: int
    finish_reason: str
    include_usage: bool
    text_seed: str


class _BadRequest(ValueError):
    pass


def _text_of_content(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return "".join(p for p in parts if isinstance(p, str))
    raise _BadRequest("message content must be a string, a list of parts or null")


def _count_chat_input(messages: object) -> int:
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("'messages' must be a non-empty list")
    total = 0
    for m in messages:
        if not isinstance(m, dict):
            raise _BadRequest("each message must be an object")
        total += _count_tokens(_text_of_content(m.get("content")))
    return total


def _count_prompt(prompt: object) -> int:
    if isinstance(prompt, str):
        return _count_tokens(prompt)
    if isinstance(prompt, list) and all(isinstance(p, int) for p in prompt):
        return len(prompt)
    if isinstance(prompt, list):
        return sum(_count_prompt(p) for p in prompt)
    raise _BadRequest("'prompt' must be a string, a list of strings or a list of token ids")


def _int_field(body: dict[str, Any], name: str, default: int | None) -> int | None:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise _BadRequest(f"'{name}' must be an integer")
    return v


def _plan_request(body: dict[str, Any], endpoint: str, config: SimConfig) -> _Plan:
    if endpoint == "chat":
        source: object = body.get("messages")
        input_tokens = _count_chat_input(source) + config.chat_template_tokens
    else:
        source = body.get("prompt", "")
        input_tokens = _count_prompt(source)
    max_tokens = _int_field(body, "max_tokens", None)
    if max_tokens is None:
        max_tokens = _int_field(body, "max_completion_tokens", config.output_len)
    assert max_tokens is not None
    if max_tokens < 1:
        raise _BadRequest("'max_tokens' must be >= 1")
    min_tokens = _int_field(body, "min_tokens", 0) or 0
    n = max_tokens
    if not body.get("ignore_eos", False) and config.eos_len is not None:
        n = min(max_tokens, max(min_tokens, config.eos_len))
    opts = body.get("stream_options")
    model = body.get("model")
    reasoning = min(config.reasoning_tokens, n) if endpoint == "chat" else 0
    return _Plan(
        endpoint=endpoint,
        stream=bool(body.get("stream", False)),
        model=model if isinstance(model, str) and model else config.model,
        input_tokens=input_tokens,
        output_tokens=n,
        reasoning_tokens=reasoning,
        finish_reason="length" if n >= max_tokens else "stop",
        include_usage=isinstance(opts, dict) and bool(opts.get("include_usage", False)),
        text_seed=json.dumps(source, sort_keys=True),
    )


def _event_count(plan: _Plan, per_event: int) -> int:
    kr = plan.reasoning_tokens
    return -(-kr // per_event) + -(-(plan.output_tokens - kr) // per_event)


def _fault_event(config: SimConfig, seq: int, plan: _Plan) -> int:
    """Index of the event before which a disconnect / stall / malformed line happens."""
    if not plan.stream:
        return 0
    n_events = _event_count(plan, config.tokens_per_event)
    k = config.fault_after_tokens
    if k is None:
        event = int(_unit(config.seed, "fault_at", seq) * n_events)
    else:
        kr, per = plan.reasoning_tokens, config.tokens_per_event
        event = -(-k // per) if k <= kr else -(-kr // per) + -(-(k - kr) // per)
    return min(event, n_events - 1)


# --------------------------------------------------------------------------- ground truth


class _Record:
    """Ground truth of one request (server clock: ``time.monotonic_ns()``)."""

    __slots__ = (
        "closed_ns",
        "conn",
        "conn_request",
        "due_ns",
        "endpoint",
        "fault",
        "fault_after_tokens",
        "fault_ns",
        "first_byte_rx_ns",
        "first_content_send_ns",
        "first_content_written_ns",
        "headers_ns",
        "input_tokens",
        "kind",
        "output_tokens",
        "received_ns",
        "rx_clock",
        "seq",
        "status",
        "stream",
        "t_ns",
        "tokens",
    )

    def __init__(self, seq: int, plan: _Plan, fault: Fault, received_ns: int) -> None:
        self.seq = seq
        self.endpoint = plan.endpoint
        self.stream = plan.stream
        self.input_tokens = plan.input_tokens
        self.output_tokens = plan.output_tokens
        self.fault = fault
        self.received_ns = received_ns
        self.first_byte_rx_ns = received_ns  # the request's first byte (see _HttpProtocol)
        self.first_content_written_ns: int | None = None  # when that write call returned
        self.first_content_send_ns: int | None = None  # its send syscall (after TLS encrypts)
        self.rx_clock = "userspace"
        self.conn = 0
        self.conn_request = 0
        self.headers_ns: int | None = None
        self.closed_ns: int | None = None
        self.fault_ns: int | None = None
        self.fault_after_tokens: int | None = None
        self.status: int | None = None
        self.t_ns = array("q")
        self.due_ns = array("q")
        self.kind = array("b")
        self.tokens = array("i")

    def add(self, t_ns: int, due_ns: int, kind: int, tokens: int) -> None:
        self.t_ns.append(t_ns)
        self.due_ns.append(due_ns)
        self.kind.append(kind)
        self.tokens.append(tokens)

    def add_marks(self, t_ns: int, marks: list[int]) -> None:
        """Events written together at ``t_ns``; ``marks`` is ``[due, kind, tokens, ...]``."""
        for i in range(0, len(marks), 3):
            self.t_ns.append(t_ns)
            self.due_ns.append(marks[i])
            self.kind.append(marks[i + 1])
            self.tokens.append(marks[i + 2])

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "endpoint": self.endpoint,
            "stream": self.stream,
            "received_ns": self.received_ns,
            "first_byte_rx_ns": self.first_byte_rx_ns,
            "first_content_written_ns": self.first_content_written_ns,
            "first_content_send_ns": self.first_content_send_ns,
            "rx_clock": self.rx_clock,
            "conn": self.conn,
            "conn_request": self.conn_request,
            "headers_ns": self.headers_ns,
            "closed_ns": self.closed_ns,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "fault": self.fault.value,
            "fault_ns": self.fault_ns,
            "fault_after_tokens": self.fault_after_tokens,
            "status": self.status,
            "events": {
                "t_ns": self.t_ns.tolist(),
                "due_ns": self.due_ns.tolist(),
                "kind": [EVENT_KINDS[k] for k in self.kind],
                "tokens": self.tokens.tolist(),
            },
        }


# --------------------------------------------------------------------------- HTTP


class StampSocket(socket.socket):
    """A socket whose reads note the kernel's receive stamp (``SO_TIMESTAMPNS``) of the data
    they returned: asyncio's transports read through ``recv`` / ``recv_into``, and the
    listening socket's ``accept`` hands out sockets of this class."""

    __slots__ = ("rx_real_ns", "send_ns", "stamp_rx")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rx_real_ns = 0  # CLOCK_REALTIME stamp of the last read's data (0: none)
        self.send_ns = 0  # monotonic time right before the last send call (TLS: encrypted)
        self.stamp_rx = False  # (listening socket) turn stamps on for accepted sockets

    def send(self, data: Any, flags: int = 0) -> int:
        self.send_ns = monotonic_ns()
        return super().send(data, flags)

    def accept(self) -> tuple[socket.socket, Any]:
        """Accepted sockets stamp from their first read on: a TLS connection's first request
        arrives with the handshake's last flight, before the protocol sees the connection."""
        fd, addr = self._accept()  # type: ignore[attr-defined]
        sock = StampSocket(self.family, self.type, self.proto, fileno=fd)
        if socket.getdefaulttimeout() is None and self.gettimeout():
            sock.setblocking(True)
        if self.stamp_rx:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        return sock, addr

    def _note(self, anc: list[tuple[int, int, bytes]]) -> None:
        for level, typ, cdata in anc:
            if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS:
                sec, nsec = _TIMESPEC.unpack_from(cdata)
                self.rx_real_ns = sec * 1_000_000_000 + nsec

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data, anc, _f, _a = self.recvmsg(bufsize, _RX_ANCBUF, flags)
        self._note(anc)
        return data

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        mv = memoryview(buffer).cast("B")
        n, anc, _f, _a = self.recvmsg_into([mv[:nbytes] if nbytes else mv], _RX_ANCBUF, flags)
        self._note(anc)
        return n


class _HttpProtocol(asyncio.Protocol):
    """One connection: h11 parses each request; the response is written by the server.

    Keep-alive: once a response has been written whole, the connection waits for the next
    request (closed after ``idle_timeout_s``), unless the client asked to close, keep-alive
    is off, or ``max_requests_per_conn`` is reached (that response says so).
    """

    def __init__(self, srv: SimServer, conn_seq: int = 0) -> None:
        self._srv = srv
        self._h11 = h11.Connection(h11.SERVER)
        self.transport: asyncio.Transport | None = None
        self._request: h11.Request | None = None
        self._body = bytearray()
        self._handled = False
        self._pending = bytearray()  # bytes that arrived while a response was being written
        self._started = False  # some byte of the current request arrived
        self._first_rx_ns = 0  # its first byte: kernel stamp (monotonic) or user-space time
        self._first_rx_clock = "userspace"
        self._idle: asyncio.TimerHandle | None = None
        self._sock: StampSocket | None = None
        self.closed = False
        self.gen: _Gen | None = None
        self.record: _Record | None = None
        self.request_id = ""
        self.conn_seq = conn_seq  # the server's count of accepted connections, this one's
        self.served = 0  # responses written whole on this connection
        self.last = False  # the response being written is the connection's last

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._srv.track(self)
        ts = transport.get_extra_info("socket")
        raw = getattr(ts, "_sock", ts)
        if isinstance(raw, StampSocket) and self._srv.config.kernel_rx_stamps:
            self._sock = raw  # stamping since accept (StampSocket.accept)

    def data_received(self, data: bytes) -> None:
        received_ns = monotonic_ns()
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self._handled:
            self._pending += data
            return
        if not self._started and data:
            self._started = True
            self._note_first_byte(received_ns)
        self._h11.receive_data(data)
        self._pump(received_ns)

    def _note_first_byte(self, received_ns: int) -> None:
        sock = self._sock
        if sock is not None and sock.rx_real_ns:
            t = sock.rx_real_ns - self._srv.clock_offset_ns
            if t <= received_ns:
                self._first_rx_ns, self._first_rx_clock = t, "kernel"
                return
        self._first_rx_ns, self._first_rx_clock = received_ns, "userspace"

    @property
    def stamp_socket(self) -> StampSocket | None:
        return self._sock

    def note_request(self, rec: _Record) -> None:
        rec.first_byte_rx_ns = self._first_rx_ns or rec.received_ns
        rec.rx_clock = self._first_rx_clock
        rec.conn = self.conn_seq
        rec.conn_request = self.served + 1

    def decide_last(self, req: h11.Request | None) -> None:
        """Is the response about to be written this connection's last?"""
        cfg = self._srv.config
        asked_close = False
        if req is not None:
            for name, value in req.headers:
                if name.lower() == b"connection" and b"close" in value.lower():
                    asked_close = True
            asked_close = asked_close or req.http_version == b"1.0"
        cap = cfg.max_requests_per_conn
        self.last = (
            not cfg.keep_alive or asked_close or req is None or bool(cap and self.served + 1 >= cap)
        )

    def response_done(self) -> None:
        """The response has been written whole: close, or wait for the next request."""
        if self.closed:
            return
        self.served += 1
        if self.last:
            self.close()
            return
        self._h11 = h11.Connection(h11.SERVER)
        self._request = None
        self._body = bytearray()
        self._handled = False
        self._started = False
        self.gen = None
        self.record = None
        self.request_id = ""
        pending, self._pending = bytes(self._pending), bytearray()
        timeout = self._srv.config.idle_timeout_s
        if pending:
            self.data_received(pending)
        elif timeout > 0 and self.transport is not None:
            self._idle = asyncio.get_running_loop().call_later(timeout, self.close)

    def eof_received(self) -> bool:
        if not self._handled:
            self._h11.receive_data(b"")
            self._pump(monotonic_ns())
        return False  # the client went away (like real servers, no half-close): close

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._idle is not None:
            self._idle.cancel()
        self._srv.untrack(self)
        if self.gen is not None:
            self.gen.release()
        if self.record is not None and self.record.closed_ns is None:
            self.record.closed_ns = monotonic_ns()

    # parsing
    def _pump(self, received_ns: int) -> None:
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as e:
                self._handled = True
                self.last = True
                self.send_simple(400, _error_body(f"bad HTTP request: {e}", "invalid_request"))
                return
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                self._request = event
                if self._h11.they_are_waiting_for_100_continue:
                    cont = h11.InformationalResponse(status_code=100, headers=[])
                    self._write(self._h11.send(cont))
            elif isinstance(event, h11.Data):
                self._body += event.data
                if len(self._body) > self._srv.config.max_body_bytes:
                    self._handled = True
                    self.last = True
                    self.send_simple(413, _error_body("request body too large", "invalid_request"))
                    return
            elif isinstance(event, h11.EndOfMessage):
                self._handled = True
                assert self._request is not None
                self.decide_last(self._request)
                self._srv.handle(self, self._request, bytes(self._body), received_ns)
                return
            else:  # ConnectionClosed before a whole request
                self._handled = True
                self.close()
                return

    # writing
    def _write(self, data: bytes | None) -> int:
        t = monotonic_ns()
        if data and self.transport is not None and not self.closed:
            self.transport.write(data)
        return t

    def _headers(self, extra: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        h = [("server", "tokentrace-sim"), *extra]
        if self.last:
            h.insert(1, ("connection", "close"))
        if self.request_id:
            h.append(("x-request-id", self.request_id))
        return h

    def send_simple(self, status: int, body: bytes, content_type: str = "application/json") -> int:
        """A whole response with a Content-Length, then keep-alive or close
        (``response_done``). Returns the stamp."""
        headers = self._headers(
            [("content-type", content_type), ("content-length", str(len(body)))]
        )
        try:
            data = self._h11.send(h11.Response(status_code=status, headers=headers))
            data = (data or b"") + (self._h11.send(h11.Data(data=body)) or b"") if body else data
            data = (data or b"") + (self._h11.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError:
            self.close()
            return monotonic_ns()
        t = self._write(data)
        self.response_done()
        return t

    def start_stream(self, first_chunks: bytes) -> int:
        """Response head for an SSE stream (chunked), plus any first chunks, in one write."""
        # Written by hand (h11's header validation costs ~50 us a request) and so is the
        # chunked body: h11 is not used again on this connection. The request id is safe in
        # a header: h11 validated it when it arrived.
        head = _STREAM_HEAD + _CLOSE_HEADER if self.last else _STREAM_HEAD
        if self.request_id:
            head += b"x-request-id: " + self.request_id.encode("latin-1") + b"\r\n"
        return self._write(head + b"\r\n" + first_chunks)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()

    def abort(self) -> None:
        """Abortive close: SO_LINGER 0 makes the kernel send an RST."""
        if self.transport is None or self.closed:
            return
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()


def _error_body(message: str, kind: str, code: int | None = None) -> bytes:
    return _json({"error": {"message": message, "type": kind, "code": code}})


# --------------------------------------------------------------------------- generation


class _Gen:
    """One request being generated: the scheduler calls ``step`` when its next event is due."""

    __slots__ = (
        "c_prefix",
        "coalesce",
        "created",
        "fault",
        "fault_event",
        "ident",
        "input_tokens",
        "itl_ns",
        "jitter_ns",
        "kr",
        "n",
        "n_events",
        "per_event",
        "plan",
        "pos",
        "proto",
        "r_prefix",
        "rec",
        "rng",
        "sent",
        "srv",
        "state",
        "suffix",
        "tail",
        "tape",
        "text_offset",
    )

    def __init__(
        self,
        srv: SimServer,
        proto: _HttpProtocol,
        rec: _Record | None,
        plan: _Plan,
        seq: int,
        fault: Fault,
    ) -> None:
        cfg = srv.config
        self.srv = srv
        self.proto = proto
        self.rec = rec
        self.plan = plan
        self.n = plan.output_tokens
        self.kr = plan.reasoning_tokens
        self.input_tokens = plan.input_tokens
        self.per_event = cfg.tokens_per_event
        self.coalesce = cfg.coalesce_late
        self.sent = 0
        self.n_events = 0
        self.state = _WAITING
        self.fault = fault
        self.fault_event = _fault_event(cfg, seq, plan) if fault is not Fault.NONE else -1
        self.itl_ns = round(cfg.itl_ms * 1e6)
        self.jitter_ns = round(cfg.itl_jitter_ms * 1e6)
        self.rng = random.Random(_h64(cfg.seed, "jitter", seq)) if self.jitter_ns else None
        self.tape = srv.tape
        self.text_offset = _h64(cfg.seed, "text", plan.text_seed) & _TAPE_MASK
        self.pos = self.text_offset
        self.created = cfg.created if cfg.created is not None else int(time.time())
        chat = plan.endpoint == "chat"
        self.ident = f"{'chatcmpl' if chat else 'cmpl'}-sim-{seq}"
        head = b'data: {"id":"%s","object":"%s","created":%d,"model":%s,"choices":[{"index":0,' % (
            self.ident.encode(),
            b"chat.completion.chunk" if chat else b"text_completion",
            self.created,
            _json(plan.model),
        )
        if chat:
            self.c_prefix = head + b'"delta":{"content":"'
            self.r_prefix = head + b'"delta":{"reasoning_content":"'
            self.suffix = b'"},"finish_reason":null}]}\n\n'
        else:
            self.c_prefix = self.r_prefix = head + b'"text":"'
            self.suffix = b'","logprobs":null,"finish_reason":null}]}\n\n'
        self.tail = self._tail()

    # chunk JSON -------------------------------------------------------------
    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        chat = self.plan.endpoint == "chat"
        obj: dict[str, Any] = {
            "id": self.ident,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": self.created,
            "model": self.plan.model,
            "choices": choices,
            **extra,
        }
        return b"data: " + _json(obj) + b"\n\n"

    def role_chunk(self) -> bytes:
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": None},
            "finish_reason": None,
        }
        return _frame(self._chunk([choice]))

    def usage(self) -> dict[str, Any]:
        u: dict[str, Any] = {
            "prompt_tokens": self.input_tokens,
            "completion_tokens": self.n,
            "total_tokens": self.input_tokens + self.n,
        }
        if self.kr:
            u["completion_tokens_details"] = {"reasoning_tokens": self.kr}
        return u

    def _tail(self) -> bytes:
        plan = self.plan
        if plan.endpoint == "chat":
            finish = {"index": 0, "delta": {}, "finish_reason": plan.finish_reason}
        else:
            finish = {"index": 0, "text": "", "logprobs": None, "finish_reason": plan.finish_reason}
        out = _frame(self._chunk([finish]))
        if plan.include_usage:
            out += _frame(self._chunk([], usage=self.usage()))
        return out + _frame(_DONE_PAYLOAD) + b"0\r\n\r\n"

    def _text(self, start: int, count: int) -> str:
        tape = self.tape
        return b"".join(tape[(start + i) & _TAPE_MASK] for i in range(count)).decode()

    def full_response(self) -> bytes:
        plan = self.plan
        off = self.text_offset
        reasoning = self._text(off, self.kr)
        content = self._text(off + self.kr, self.n - self.kr)
        if plan.endpoint == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if self.kr:
                message["reasoning_content"] = reasoning
            choice: dict[str, Any] = {
                "index": 0,
                "message": message,
                "finish_reason": plan.finish_reason,
            }
            obj = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": content,
                "logprobs": None,
                "finish_reason": plan.finish_reason,
            }
            obj = "text_completion"
        return _json(
            {
                "id": self.ident,
                "object": obj,
                "created": self.created,
                "model": plan.model,
                "choices": [choice],
                "usage": self.usage(),
            }
        )

    # timing -------------------------------------------------------------------
    def next_size(self) -> int:
        sent, kr = self.sent, self.kr
        if sent < kr:
            return min(self.per_event, kr - sent)
        return min(self.per_event, self.n - sent)

    def gap(self, count: int) -> int:
        """Nanoseconds that ``count`` more tokens take to generate."""
        if count <= 0:
            return 0
        srv = self.srv
        base = self.itl_ns + srv.per_active_ns * (srv.waiting + srv.running)
        j = self.jitter_ns
        if j == 0:
            return count * base
        assert self.rng is not None
        uniform = self.rng.uniform
        return sum(max(0, base + round(uniform(-j, j))) for _ in range(count))

    def first_due(self, received_ns: int) -> int:
        cfg = self.srv.config
        ttft = round((cfg.ttft_ms + cfg.per_input_token_ms * self.input_tokens) * 1e6)
        last = self.n if not self.plan.stream else self.next_size()
        return received_ns + ttft + self.gap(last - 1)

    # the hot path ---------------------------------------------------------------
    def step(self, due: int, now: int) -> int | None:
        """Write the event due at ``due`` (and, when late, the ones due by ``now`` with it).

        Returns the next deadline, or None when this request leaves the scheduler.
        """
        if self.state == _FINISHED:
            return None
        proto = self.proto
        if proto.closed:
            self.release()
            return None
        fault_now = self.n_events == self.fault_event
        if fault_now and self.fault in _STOP_FAULTS:
            self._stop(self.fault is Fault.DISCONNECT)
            return None
        if not self.plan.stream:
            self._respond_whole(due, fault_now)
            return None
        data, marks, nxt = self._build(due, now)
        t = monotonic_ns()
        transport = proto.transport
        assert transport is not None
        transport.write(data)
        rec = self.rec
        if rec is not None and rec.first_content_written_ns is None and _K_CONTENT in marks[1::3]:
            rec.first_content_written_ns = monotonic_ns()  # the send (TLS: encrypted) is done
            sock = proto.stamp_socket
            if sock is not None and t <= sock.send_ns <= rec.first_content_written_ns:
                rec.first_content_send_ns = sock.send_ns  # the send syscall itself began
        if self.state == _WAITING:
            self.state = _RUNNING
            self.srv.waiting -= 1
            self.srv.running += 1
        if self.rec is not None:
            self.rec.add_marks(t, marks)
        if nxt is None:
            self.release()
            self.srv.success_total += 1
            proto.response_done()
        return nxt

    def _build(self, due: int, now: int) -> tuple[bytes, list[int], int | None]:
        """Bytes of the event due at ``due`` (plus any later ones already due when catching
        up), their ground-truth marks ``[due, kind, tokens, ...]`` and the next deadline."""
        parts: list[bytes] = []
        marks: list[int] = []
        tape, suffix, srv = self.tape, self.suffix, self.srv
        while True:
            if self.n_events == self.fault_event and self.fault is Fault.MALFORMED:
                parts.append(_MALFORMED_FRAME)
                marks += (due, _K_MALFORMED, 0)
            sent = self.sent
            if sent < self.kr:
                count = min(self.per_event, self.kr - sent)
                prefix, kind = self.r_prefix, _K_REASONING
            else:
                count = min(self.per_event, self.n - sent)
                prefix, kind = self.c_prefix, _K_CONTENT
            pos = self.pos
            if count == 1:
                text = tape[pos & _TAPE_MASK]
            else:
                text = b"".join([tape[(pos + i) & _TAPE_MASK] for i in range(count)])
            self.pos = pos + count
            payload = prefix + text + suffix
            parts.append(b"%x\r\n%b\r\n" % (len(payload), payload))
            marks += (due, kind, count)
            self.sent = sent = sent + count
            self.n_events += 1
            srv.generation_tokens_total += count
            srv.kv_tokens += count
            if sent >= self.n:
                parts.append(self.tail)
                marks += self.tail_marks(due)
                return b"".join(parts), marks, None
            nxt = due + self.gap(self.next_size())
            if nxt > now or not self.coalesce or self.n_events == self.fault_event:
                return (parts[0] if len(parts) == 1 else b"".join(parts)), marks, nxt
            due = nxt

    def tail_marks(self, due: int) -> list[int]:
        marks = [due, _K_FINISH, 0]
        if self.plan.include_usage:
            marks += (due, _K_USAGE, 0)
        return [*marks, due, _K_DONE, 0]

    def _respond_whole(self, due: int, malformed: bool) -> None:
        body = b'{"id": "not json' if malformed else self.full_response()
        t = self.proto.send_simple(200, body)
        self.srv.generation_tokens_total += self.n
        if self.rec is not None:
            self.rec.status = 200
            self.rec.headers_ns = t
            self.rec.add(t, due, _K_MALFORMED if malformed else _K_RESPONSE, self.n)
        self.release()
        self.srv.success_total += 1

    def _stop(self, abort: bool) -> None:
        t = monotonic_ns()
        if abort:
            self.proto.abort()
        if self.rec is not None:
            self.rec.fault_ns = t
            self.rec.fault_after_tokens = self.sent
        self.release()

    def release(self) -> None:
        """Leave the batch (idempotent): finished, faulted or the client went away."""
        srv = self.srv
        if self.state == _WAITING:
            srv.waiting -= 1
        elif self.state == _RUNNING:
            srv.running -= 1
        else:
            return
        self.state = _FINISHED
        srv.kv_tokens -= self.input_tokens + self.sent


# --------------------------------------------------------------------------- scheduler


class _Scheduler:
    """One task, one heap of deadlines for every active request.

    Heap entries are plain ints ``(deadline_ns << _SLOT_BITS) | slot`` (cheap to compare, not
    tracked by the garbage collector); ``slot`` indexes the generator. epoll sleeps in whole
    milliseconds (rounded up), so the task sleeps until ``spin_ns`` before the next deadline
    and then polls the loop (``sleep(0)``: I/O is still served) until it is due. Deadlines
    are absolute: lateness never accumulates.
    """

    def __init__(self, spin_ns: int) -> None:
        self._heap: list[int] = []
        self._slots: list[_Gen | None] = []
        self._free: list[int] = []
        self._spin_ns = spin_ns
        self._waiter: asyncio.Future[None] | None = None
        self._waiter_due = 0

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, due: int, gen: _Gen) -> None:
        if self._free:
            slot = self._free.pop()
            self._slots[slot] = gen
        else:
            slot = len(self._slots)
            if slot > _SLOT_MASK:
                raise RuntimeError("too many concurrent requests for the simulator")
            self._slots.append(gen)
        heapq.heappush(self._heap, (due << _SLOT_BITS) | slot)
        w = self._waiter
        if w is not None and due < self._waiter_due and not w.done():
            w.set_result(None)

    def clear(self) -> None:
        self._heap.clear()
        self._slots.clear()
        self._free.clear()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        heap = self._heap
        while True:
            if not heap:
                await self._sleep(loop, None)
                continue
            now = monotonic_ns()
            due = heap[0] >> _SLOT_BITS
            if due <= now:
                self._run_due(now)
                await asyncio.sleep(0)
            elif due - now <= self._spin_ns:
                await asyncio.sleep(0)
            else:
                await self._sleep(loop, due)

    def _run_due(self, now: int) -> None:
        heap, slots = self._heap, self._slots
        limit = (now + 1) << _SLOT_BITS
        while heap and heap[0] < limit:
            key = heap[0]
            slot = key & _SLOT_MASK
            gen = slots[slot]
            assert gen is not None
            nxt = gen.step(key >> _SLOT_BITS, now)
            if nxt is None:
                heapq.heappop(heap)
                slots[slot] = None
                self._free.append(slot)
            else:
                heapq.heapreplace(heap, (nxt << _SLOT_BITS) | slot)

    async def _sleep(self, loop: asyncio.AbstractEventLoop, due: int | None) -> None:
        fut: asyncio.Future[None] = loop.create_future()
        self._waiter = fut
        self._waiter_due = due if due is not None else 2**63
        handle = None
        if due is not None:
            handle = loop.call_at((due - self._spin_ns) / 1e9, _resolve, fut)
        try:
            await fut
        finally:
            if handle is not None:
                handle.cancel()
            self._waiter = None


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _build_tape(seed: int) -> list[bytes]:
    rng = random.Random(_h64(seed, "tape"))
    words = [(" " + w).encode() for w in WORDS]
    return rng.choices(words, k=1 << _TAPE_BITS)


# --------------------------------------------------------------------------- server


class SimServer:
    """The simulator's state and routes; ``start()`` binds, ``close()`` stops."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.tape = _build_tape(config.seed)
        self.per_active_ns = round(config.itl_per_active_ms * 1e6)
        self.port = 0
        self.waiting = 0
        self.running = 0
        self.kv_tokens = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.success_total = 0
        self.requests_by_fault: dict[str, int] = {f.value: 0 for f in Fault}
        self._seq = 0
        self.connections_accepted = 0
        self.clock_offset_ns = _clock_offset()
        self._records: dict[str, _Record] = {}
        self._conns: set[_HttpProtocol] = set()
        self._sched = _Scheduler(config.spin_us * 1000)
        self._server: asyncio.base_events.Server | None = None
        self._clock_timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._accepted,
            sock=_listen_socket(self.config.host, self.config.port, self.config.kernel_rx_stamps),
            backlog=4096,
            ssl=server_ssl_context(self.config),
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._resample_clock()
        self._task = asyncio.create_task(self._sched.run(), name="tokentrace-sim-scheduler")
        return self.port

    async def close(self) -> None:
        if self._clock_timer is not None:
            self._clock_timer.cancel()
        if self._server is not None:
            self._server.close()
        for proto in list(self._conns):
            if proto.transport is not None:
                proto.transport.abort()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._sched.clear()
        if self._server is not None:
            await self._server.wait_closed()

    def _accepted(self) -> _HttpProtocol:
        self.connections_accepted += 1
        return _HttpProtocol(self, self.connections_accepted)

    def _resample_clock(self) -> None:
        """``realtime - monotonic`` for the kernel stamps, about once a second."""
        self.clock_offset_ns = _clock_offset()
        self._clock_timer = asyncio.get_running_loop().call_later(1.0, self._resample_clock)

    def track(self, proto: _HttpProtocol) -> None:
        self._conns.add(proto)

    def untrack(self, proto: _HttpProtocol) -> None:
        self._conns.discard(proto)

    # ground truth -------------------------------------------------------------
    def ground_truth(self) -> dict[str, Any]:
        return {
            "clock": "monotonic_ns",
            "pid": os.getpid(),
            "config": self.config.to_dict(),
            "event_kinds": list(EVENT_KINDS),
            "connections_accepted": self.connections_accepted,
            "requests": {rid: r.to_json() for rid, r in self._records.items()},
        }

    def reset(self) -> None:
        """Forget the ground truth and restart the request counter (faults repeat)."""
        self._records.clear()
        self._seq = 0
        self.connections_accepted = 0

    # routing --------------------------------------------------------------------
    def handle(self, proto: _HttpProtocol, req: h11.Request, body: bytes, received_ns: int) -> None:
        method = req.method.decode("latin-1").upper()
        path = req.target.decode("latin-1").split("?", 1)[0].rstrip("/") or "/"
        routes: dict[str, tuple[str, Callable[[], object]]] = {
            "/health": ("GET", lambda: proto.send_simple(200, b'{"status":"ok"}')),
            "/v1/models": ("GET", lambda: proto.send_simple(200, self._models())),
            "/metrics": (
                "GET",
                lambda: proto.send_simple(
                    200, self.metrics_text().encode(), "text/plain; version=0.0.4"
                ),
            ),
            "/_sim/ground_truth": (
                "GET",
                lambda: proto.send_simple(200, _json(self.ground_truth())),
            ),
            "/_sim/reset": ("POST", lambda: self._reset_route(proto)),
            "/v1/chat/completions": (
                "POST",
                lambda: self._complete(proto, req, body, received_ns, "chat"),
            ),
            "/v1/completions": (
                "POST",
                lambda: self._complete(proto, req, body, received_ns, "completions"),
            ),
        }
        route = routes.get(path)
        if route is None:
            proto.send_simple(404, _error_body(f"no route {path}", "not_found", 404))
        elif method != route[0]:
            proto.send_simple(405, _error_body(f"{method} not allowed", "invalid_request", 405))
        else:
            route[1]()

    def _reset_route(self, proto: _HttpProtocol) -> None:
        self.reset()
        proto.send_simple(200, b'{"ok":true}')

    def _models(self) -> bytes:
        return _json(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.config.model,
                        "object": "model",
                        "created": 0,
                        "owned_by": "tokentrace-sim",
                    }
                ],
            }
        )

    def _complete(
        self, proto: _HttpProtocol, req: h11.Request, body: bytes, received_ns: int, endpoint: str
    ) -> None:
        try:
            payload = json.loads(body)
            if not isinstance(payload, dict):
                raise _BadRequest("the body must be a JSON object")
            plan = _plan_request(payload, endpoint, self.config)
        except (ValueError, RecursionError) as e:
            proto.send_simple(400, _error_body(str(e), "invalid_request_error", 400))
            return
        self._seq += 1
        seq = self._seq
        proto.request_id = self._request_id(req, seq)
        fault = decide_fault(self.config, seq)
        self.requests_by_fault[fault.value] += 1
        self.prompt_tokens_total += plan.input_tokens
        rec = _Record(seq, plan, fault, received_ns)
        proto.note_request(rec)
        if self.config.record_ground_truth:
            self._records[proto.request_id] = rec
            proto.record = rec
        if fault is Fault.ERROR:
            t = proto.send_simple(500, _error_body("simulated server error", "server_error", 500))
            rec.status, rec.headers_ns, rec.fault_ns = 500, t, t
            rec.add(t, received_ns, _K_ERROR, 0)
            return
        if fault is Fault.HANG:
            rec.fault_ns = received_ns
            return
        self._begin(proto, rec, plan, seq, fault, received_ns)

    def _begin(
        self,
        proto: _HttpProtocol,
        rec: _Record,
        plan: _Plan,
        seq: int,
        fault: Fault,
        received_ns: int,
    ) -> None:
        gen = _Gen(self, proto, rec if self.config.record_ground_truth else None, plan, seq, fault)
        proto.gen = gen
        self.waiting += 1
        self.kv_tokens += plan.input_tokens
        if plan.stream:
            role = self.config.role_chunk and plan.endpoint == "chat"
            t = proto.start_stream(gen.role_chunk() if role else b"")
            rec.headers_ns, rec.status = t, 200
            if role:
                rec.add(t, received_ns, _K_ROLE, 0)
        self._sched.add(gen.first_due(received_ns), gen)

    def _request_id(self, req: h11.Request, seq: int) -> str:
        rid = ""
        for name, value in req.headers:
            if name.lower() == b"x-request-id":
                rid = value.decode("latin-1").strip()
        rid = rid or f"sim-{seq}"
        if rid in self._records:
            rid = f"{rid}#{seq}"
        return rid

    # metrics ------------------------------------------------------------------
    def metrics_text(self) -> str:
        label = "{model_name=" + json.dumps(self.config.model) + "}"
        cache = min(1.0, max(0.0, self.kv_tokens / self.config.kv_capacity_tokens))
        rows: list[tuple[str, str, str, str, float]] = [
            (
                "vllm:num_requests_running",
                "gauge",
                "Requests generating tokens.",
                label,
                self.running,
            ),
            (
                "vllm:num_requests_waiting",
                "gauge",
                "Requests before their first token.",
                label,
                self.waiting,
            ),
            (
                "vllm:gpu_cache_usage_perc",
                "gauge",
                "Simulated KV-cache usage (1 = full).",
                label,
                cache,
            ),
            (
                "vllm:prompt_tokens_total",
                "counter",
                "Prompt tokens of accepted requests.",
                label,
                self.prompt_tokens_total,
            ),
            (
                "vllm:generation_tokens_total",
                "counter",
                "Generated tokens sent.",
                label,
                self.generation_tokens_total,
            ),
            (
                "vllm:request_success_total",
                "counter",
                "Requests answered in full.",
                label,
                self.success_total,
            ),
        ]
        lines: list[str] = []
        for name, kind, help_text, labels, value in rows:
            lines += [
                f"# HELP {name} {help_text}",
                f"# TYPE {name} {kind}",
                f"{name}{labels} {_num(value)}",
            ]
        lines += [
            "# HELP tokentrace_sim_requests_total Completion requests by injected fault.",
            "# TYPE tokentrace_sim_requests_total counter",
        ]
        lines += [
            f'tokentrace_sim_requests_total{{fault="{f}"}} {n}'
            for f, n in self.requests_by_fault.items()
        ]
        lines += [
            "# HELP tokentrace_sim_open_connections Open connections.",
            "# TYPE tokentrace_sim_open_connections gauge",
            f"tokentrace_sim_open_connections {len(self._conns)}",
        ]
        return "\n".join(lines) + "\n"


def _clock_offset() -> int:
    """``CLOCK_REALTIME - CLOCK_MONOTONIC`` in ns, from the tightest of a few reads."""
    best_gap, offset = -1, 0
    for _ in range(7):
        a = time.monotonic_ns()
        r = time.time_ns()
        b = time.monotonic_ns()
        if best_gap < 0 or b - a < best_gap:
            best_gap, offset = b - a, r - (a + b) // 2
    return offset


def _listen_socket(host: str, port: int, stamps: bool = True) -> StampSocket:
    """The listening socket (with ``stamps``, its accepted sockets stamp what they read)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    if not infos:
        raise OSError(f"cannot resolve {host}")
    family, stype, proto, _canon, addr = infos[0]
    sock = StampSocket(family, stype, proto)
    sock.stamp_rx = stamps
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(addr)
        sock.listen(4096)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


async def serve(config: SimConfig, *, on_ready: Callable[[int], None] | None = None) -> None:
    """Run the simulator until cancelled; ``on_ready(port)`` is called once it listens."""
    server = SimServer(config)
    await server.start()
    try:
        if on_ready is not None:
            on_ready(server.port)
        await asyncio.Event().wait()
    finally:
        await server.close()


# --------------------------------------------------------------------------- handles


def _client_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def _base_url(host: str, port: int, tls: bool = False) -> str:
    h = _client_host(host)
    scheme = "https" if tls else "http"
    return f"{scheme}://[{h}]:{port}" if ":" in h else f"{scheme}://{h}:{port}"


def server_ssl_context(config: SimConfig) -> ssl.SSLContext | None:
    """The server-side TLS context when the config asks for https, else None. Raises
    ``OSError`` (``ssl.SSLError`` is one) when the certificate or key cannot be loaded."""
    if config.tls_certfile is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(config.tls_certfile, config.tls_keyfile)
    return ctx


def _control_verify(config: SimConfig) -> bool | ssl.SSLContext:
    """TLS verification for the harness's own control calls (ground truth, reset) to the
    simulator process it started: none (its certificate is often a throwaway one)."""
    if not config.tls:
        return True
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


class SimulatorHandle(Protocol):
    @property
    def port(self) -> int: ...

    @property
    def base_url(self) -> str: ...

    def ground_truth(self) -> dict[str, Any]: ...

    def reset(self) -> None: ...

    def stop(self) -> None: ...


class SimulatorThread:
    """The simulator in a background thread with its own event loop (for tests)."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: SimServer | None = None
        self._stop_fut: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="tokentrace-sim", daemon=True)

    def start(self, timeout_s: float = 10.0) -> SimulatorThread:
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise RuntimeError("simulator thread did not start")
        if self._error is not None:
            raise RuntimeError(f"simulator failed to start: {self._error}") from self._error
        return self

    def _main(self) -> None:
        try:
            asyncio.run(self._amain())
        except BaseException as e:  # reported to the starting thread
            self._error = e
            self._ready.set()

    async def _amain(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_fut = self._loop.create_future()
        server = SimServer(self.config)
        await server.start()
        self._server = server
        self._ready.set()
        try:
            await self._stop_fut
        finally:
            await server.close()

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return self._server.port

    @property
    def base_url(self) -> str:
        return _base_url(self.config.host, self.port, self.config.tls)

    def _call(self, fn: Callable[[], Any]) -> Any:
        assert self._loop is not None
        cf = asyncio.run_coroutine_threadsafe(_call_async(fn), self._loop)
        return cf.result(timeout=30)

    def ground_truth(self) -> dict[str, Any]:
        server = self._server
        assert server is not None
        result: dict[str, Any] = self._call(server.ground_truth)
        return result

    def reset(self) -> None:
        server = self._server
        assert server is not None
        self._call(server.reset)

    def stop(self) -> None:
        loop, fut = self._loop, self._stop_fut
        if loop is not None and fut is not None and self._thread.is_alive():
            loop.call_soon_threadsafe(_resolve, fut)
        self._thread.join(timeout=10)

    def __enter__(self) -> SimulatorThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _call_async(fn: Callable[[], Any]) -> Any:
    return fn()


def start_simulator_thread(config: SimConfig) -> SimulatorThread:
    return SimulatorThread(config).start()


_READY = re.compile(r"listening on (https?://\S+)")


class SimulatorProcess:
    """The simulator in a separate process (``python -m app.targets.simulator``)."""

    def __init__(self, config: SimConfig, *, cpus: set[int] | None = None) -> None:
        self.config = config
        self._cpus = cpus
        self._proc: subprocess.Popen[bytes] | None = None
        self._port = 0

    def start(self, timeout_s: float = 30.0) -> SimulatorProcess:
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        cmd = [
            sys.executable,
            "-m",
            "app.targets.simulator",
            "--config-json",
            json.dumps(self.config.to_dict()),
        ]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, cwd=root)
        if self._cpus is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(self._proc.pid, self._cpus)
        line = _read_line(self._proc, timeout_s)
        m = _READY.search(line)
        if m is None:
            self.stop()
            raise RuntimeError(f"simulator process did not start: {line.strip()!r}")
        self._port = int(m.group(1).rsplit(":", 1)[1])
        return self

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        return _base_url(self.config.host, self._port, self.config.tls)

    def ground_truth(self) -> dict[str, Any]:
        import httpx

        r = httpx.get(
            self.base_url + "/_sim/ground_truth",
            timeout=60,
            verify=_control_verify(self.config),
        )
        r.raise_for_status()
        data: dict[str, Any] = r.json()
        return data

    def reset(self) -> None:
        import httpx

        httpx.post(
            self.base_url + "/_sim/reset", timeout=30, verify=_control_verify(self.config)
        ).raise_for_status()

    def stop(self) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()

    def __enter__(self) -> SimulatorProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _read_line(proc: subprocess.Popen[bytes], timeout_s: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    if not ready:
        return "(timed out)"
    return proc.stdout.readline().decode(errors="replace")


def start_simulator_process(
    config: SimConfig, *, cpus: set[int] | None = None, timeout_s: float = 30.0
) -> SimulatorProcess:
    """Start the simulator in its own process (optionally pinned to ``cpus``)."""
    return SimulatorProcess(config, cpus=cpus).start(timeout_s)


# --------------------------------------------------------------------------- CLI


class _UsageError(Exception):
    pass


class _ArgParser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse prints two lines and exits; we raise
        raise _UsageError(message)


def build_arg_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The ``tokentrace sim`` options (added to ``parser`` when given, e.g. a subparser)."""
    p = parser or _ArgParser(
        prog="tokentrace sim", description="Deterministic OpenAI-compatible streaming simulator."
    )
    d = SimConfig()
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default=d.model)
    p.add_argument("--ttft-ms", type=float, default=d.ttft_ms)
    p.add_argument("--per-input-token-ms", type=float, default=d.per_input_token_ms)
    p.add_argument("--itl-ms", type=float, default=d.itl_ms)
    p.add_argument("--itl-jitter-ms", type=float, default=d.itl_jitter_ms)
    p.add_argument("--itl-per-active-ms", type=float, default=d.itl_per_active_ms)
    p.add_argument("--tokens-per-event", type=int, default=d.tokens_per_event)
    p.add_argument("--no-role-chunk", action="store_true", help="omit the role-only chunk")
    p.add_argument(
        "--output-len",
        type=int,
        default=d.output_len,
        help="tokens when a request has no max_tokens",
    )
    p.add_argument(
        "--eos-len",
        type=int,
        default=None,
        help="stop after this many tokens unless ignore_eos/min_tokens say otherwise",
    )
    p.add_argument("--reasoning-tokens", type=int, default=d.reasoning_tokens)
    p.add_argument("--error-rate", type=float, default=0.0)
    p.add_argument("--disconnect-rate", type=float, default=0.0)
    p.add_argument("--stall-rate", type=float, default=0.0)
    p.add_argument("--malformed-rate", type=float, default=0.0)
    p.add_argument("--hang-rate", type=float, default=0.0)
    p.add_argument("--fault-after-tokens", type=int, default=None)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--tls-certfile",
        default=None,
        metavar="PEM",
        help="serve https with this certificate (chain); needs --tls-keyfile",
    )
    p.add_argument(
        "--tls-keyfile", default=None, metavar="PEM", help="private key of --tls-certfile"
    )
    p.add_argument(
        "--no-ground-truth",
        action="store_true",
        help="do not keep per-event ground truth (long runs)",
    )
    p.add_argument(
        "--no-keep-alive", action="store_true", help="close every connection after its response"
    )
    p.add_argument(
        "--idle-timeout-s",
        type=float,
        default=d.idle_timeout_s,
        help="close a kept-alive connection left idle this long (0: never)",
    )
    p.add_argument(
        "--max-requests-per-conn",
        type=int,
        default=d.max_requests_per_conn,
        help="answer at most this many requests on one connection (0: no cap)",
    )
    p.add_argument("--config-json", default=None, help=argparse.SUPPRESS)
    return p


def config_from_args(ns: argparse.Namespace) -> SimConfig:
    """A ``SimConfig`` from parsed options; raises ValueError with a one-line reason."""
    if ns.config_json:
        data = json.loads(ns.config_json)
        if not isinstance(data, dict):
            raise ValueError("--config-json must be a JSON object")
        return SimConfig.from_dict(data)
    return SimConfig(
        host=ns.host,
        port=ns.port,
        model=ns.model,
        ttft_ms=ns.ttft_ms,
        per_input_token_ms=ns.per_input_token_ms,
        itl_ms=ns.itl_ms,
        itl_jitter_ms=ns.itl_jitter_ms,
        itl_per_active_ms=ns.itl_per_active_ms,
        tokens_per_event=ns.tokens_per_event,
        role_chunk=not ns.no_role_chunk,
        output_len=ns.output_len,
        eos_len=ns.eos_len,
        reasoning_tokens=ns.reasoning_tokens,
        error_rate=ns.error_rate,
        disconnect_rate=ns.disconnect_rate,
        stall_rate=ns.stall_rate,
        malformed_rate=ns.malformed_rate,
        hang_rate=ns.hang_rate,
        fault_after_tokens=ns.fault_after_tokens,
        seed=ns.seed,
        record_ground_truth=not ns.no_ground_truth,
        keep_alive=not ns.no_keep_alive,
        idle_timeout_s=ns.idle_timeout_s,
        max_requests_per_conn=ns.max_requests_per_conn,
        tls_certfile=ns.tls_certfile,
        tls_keyfile=ns.tls_keyfile,
    )


async def _serve_until_signal(config: SimConfig) -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)

    def ready(port: int) -> None:
        print(
            f"tokentrace sim: listening on {_base_url(config.host, port, config.tls)} "
            f"(pid {os.getpid()})",
            flush=True,
        )

    gc.freeze()  # start-up objects never need scanning again: shorter collections
    with contextlib.suppress(asyncio.CancelledError):
        await serve(config, on_ready=ready)


def main(argv: Sequence[str] | None = None) -> int:
    """``tokentrace sim``: 0 when stopped by a signal, 2 on bad arguments, 1 if it cannot bind."""
    parser = build_arg_parser()
    try:
        ns = parser.parse_args(argv)
        config = config_from_args(ns)
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except (_UsageError, ValueError) as e:
        print(f"tokentrace sim: error: {e}", file=sys.stderr)
        return 2
    try:
        server_ssl_context(config)  # a bad certificate or key is a usage error, not a bind one
    except OSError as e:
        print(f"tokentrace sim: error: cannot load the TLS certificate/key: {e}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve_until_signal(config))
    except OSError as e:
        print(
            f"tokentrace sim: error: cannot listen on {config.host}:{config.port}: {e}",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
