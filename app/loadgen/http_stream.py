"""The hot path: one streaming HTTP/1.1 request on a raw non-blocking socket driven by h11.

Timing model
------------
* ``t0`` is ``time.monotonic_ns()`` taken right before ``connect``: connection setup is part
  of TTFT (one connection per request, as a fresh client would see it).
* Plain HTTP on Linux: the socket has ``SO_TIMESTAMPNS`` on and every read is a
  ``recvmsg`` whose ``SCM_TIMESTAMPNS`` control message is the kernel's receive time of the
  (last) segment the read returned, on ``CLOCK_REALTIME``. ``ClockMap`` converts it to the
  monotonic clock with an offset ``realtime - monotonic`` sampled at run start and re-sampled
  during the run (the runner's monitor does it about once a second and records the drift),
  so an NTP slew or step cannot bend a run by more than about a second's worth of slew.
  Kernel stamps do not depend on when the event loop got round to reading: a busy client
  still measures arrival times right, as long as the reads do not coalesce several events
  (events completed by one read all share its stamp).
* Otherwise (TLS, non-Linux, option refused, ``kernel_stamps=False``) each read is stamped
  with ``time.monotonic_ns()`` first thing in the read callback (user-space stamps).

HTTP framing: h11 writes the request and parses the response head (status, headers, 1xx);
the body is then decoded by ``ChunkedBody`` / ``LengthBody`` here, because h11's per-chunk
event machinery cost ~13 us per SSE event, most of the client's per-read budget at
hundreds of streams. The read callback only stamps, decodes the framing, splits SSE events
and appends ``(stamp, nbytes, data)``; JSON parsing and token counting happen after the
stream ends, in small slices between I/O rounds (``app.loadgen.records``, the runner), so
parsing work cannot delay another stream's reads.

An EOF (read-until-close body) carries no segment, hence no kernel stamp: its read is
stamped in user space and not counted against ``RawStream.clock``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import struct
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import h11

from app.domain import ClockSource, RequestStatus
from app.loadgen.events import snippet
from app.loadgen.sse import DEFAULT_MAX_EVENT_BYTES, SSEEventTooLarge, SSEParser

SO_TIMESTAMPNS: int = getattr(socket, "SO_TIMESTAMPNS", 35)
SCM_TIMESTAMPNS: int = getattr(socket, "SCM_TIMESTAMPNS", SO_TIMESTAMPNS)
_TIMESPEC = struct.Struct("@qq")  # struct timespec on 64-bit Linux
_ANCBUF = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0
_ERROR_BODY_CAP = 2048
_DONE = b"[DONE]"
USER_AGENT = "tokentrace/0.1"


# --------------------------------------------------------------------------- clocks


def sample_clock_offset(tries: int = 7) -> int:
    """``CLOCK_REALTIME - CLOCK_MONOTONIC`` in ns, from the tightest of a few bracketed reads."""
    best_gap = -1
    offset = 0
    for _ in range(tries):
        a = time.monotonic_ns()
        r = time.time_ns()
        b = time.monotonic_ns()
        if best_gap < 0 or b - a < best_gap:
            best_gap = b - a
            offset = r - (a + b) // 2
    return offset


@dataclass(slots=True)
class ClockMap:
    """Maps kernel ``CLOCK_REALTIME`` stamps onto ``time.monotonic_ns()``.

    ``offset_ns`` is the current ``realtime - monotonic``; ``resample()`` updates it and
    tracks how far it moved since the first sample (``max_drift_ns``).
    """

    offset_ns: int = field(default_factory=sample_clock_offset)
    initial_offset_ns: int = 0
    max_drift_ns: int = 0
    samples: int = 1

    def __post_init__(self) -> None:
        self.initial_offset_ns = self.offset_ns

    def resample(self) -> int:
        self.offset_ns = sample_clock_offset()
        self.samples += 1
        drift = abs(self.offset_ns - self.initial_offset_ns)
        self.max_drift_ns = max(self.max_drift_ns, drift)
        return self.offset_ns

    def to_monotonic(self, realtime_ns: int) -> int:
        return realtime_ns - self.offset_ns


def kernel_stamps_supported() -> bool:
    return sys.platform.startswith("linux") and _ANCBUF > 0


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class Target:
    scheme: str
    host: str
    port: int
    base_path: str  # without trailing slash; "" or e.g. "/v1"

    @property
    def tls(self) -> bool:
        return self.scheme == "https"

    @property
    def host_header(self) -> str:
        default = 443 if self.tls else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"

    def path_for(self, endpoint: str) -> str:
        tail = "/chat/completions" if endpoint == "chat" else "/completions"
        base = self.base_path if self.base_path.endswith("/v1") else self.base_path + "/v1"
        return base + tail


def parse_target(base_url: str) -> Target:
    u = urlsplit(base_url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"unsupported target URL {base_url!r}")
    port = u.port or (443 if u.scheme == "https" else 80)
    return Target(u.scheme, u.hostname, port, u.path.rstrip("/"))


def request_body(
    *,
    endpoint: str,
    model: str,
    prompt: str | None,
    messages: list[dict[str, Any]] | None,
    output_len: int,
    ignore_eos: bool,
    extra_body: Mapping[str, object] | None = None,
) -> bytes:
    body: dict[str, Any] = {"model": model}
    if endpoint == "chat":
        body["messages"] = (
            messages if messages is not None else [{"role": "user", "content": prompt or ""}]
        )
    else:
        if prompt is None:
            raise ValueError("the completions endpoint needs a text prompt, not messages")
        body["prompt"] = prompt
    body["max_tokens"] = output_len
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    if ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = output_len
    if extra_body:
        body.update(extra_body)
    return json.dumps(body, separators=(",", ":")).encode()


def request_headers(target: Target, request_id: str, api_key: str | None) -> list[tuple[str, str]]:
    headers = [
        ("Host", target.host_header),
        ("User-Agent", USER_AGENT),
        ("Content-Type", "application/json"),
        ("Accept", "text/event-stream"),
        ("Connection", "close"),
        ("X-Request-Id", request_id),
    ]
    if api_key:
        headers.append(("Authorization", f"Bearer {api_key}"))
    return headers


# --------------------------------------------------------------------------- bodies


class BodyError(ValueError):
    """The response body's framing is broken."""


class ChunkedBody:
    """Incremental ``Transfer-Encoding: chunked`` decoder (hot path: a few slices per read).

    ``feed`` returns the payload bytes the read completed (chunk boundaries carry no meaning
    for SSE); ``done`` turns true at the last (zero-size) chunk. Trailers are ignored.
    """

    __slots__ = ("_buf", "_crlf", "_remaining", "done")

    def __init__(self) -> None:
        self._buf = b""
        self._remaining = 0  # payload bytes left in the current chunk
        self._crlf = False  # expecting the CRLF that ends a chunk's payload
        self.done = False

    def feed(self, data: bytes) -> bytes:
        buf = self._buf + data if self._buf else data
        n = len(buf)
        pos = 0
        out: list[bytes] = []
        while pos < n and not self.done:
            if self._remaining:
                end = min(n, pos + self._remaining)
                out.append(buf[pos:end])
                self._remaining -= end - pos
                pos = end
                self._crlf = self._remaining == 0
            elif self._crlf:
                if n - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise BodyError("chunked body: missing CRLF after chunk data")
                pos += 2
                self._crlf = False
            else:
                i = buf.find(b"\n", pos)
                if i < 0:
                    if n - pos > 1024:
                        raise BodyError("chunked body: chunk-size line too long")
                    break
                line = buf[pos:i].split(b";", 1)[0].strip()
                pos = i + 1
                try:
                    size = int(line, 16)
                except ValueError:
                    raise BodyError(f"chunked body: bad chunk size {line[:40]!r}") from None
                if size < 0:
                    raise BodyError("chunked body: negative chunk size")
                if size == 0:
                    self.done = True
                self._remaining = size
        self._buf = buf[pos:] if pos < n and not self.done else b""
        if len(out) == 1:
            return out[0]
        return b"".join(out)


class LengthBody:
    """``Content-Length`` body, or read-until-close when ``length`` is None."""

    __slots__ = ("_remaining", "done")

    def __init__(self, length: int | None) -> None:
        self._remaining = length
        self.done = length == 0

    @property
    def until_close(self) -> bool:
        return self._remaining is None

    def feed(self, data: bytes) -> bytes:
        r = self._remaining
        if r is None:
            return data
        if len(data) >= r:
            self._remaining = 0
            self.done = True
            return data[:r]
        self._remaining = r - len(data)
        return data


def body_decoder(resp: h11.Response) -> ChunkedBody | LengthBody:
    te = b""
    cl: bytes | None = None
    for name, value in resp.headers:
        if name == b"transfer-encoding":
            te = value.lower()
        elif name == b"content-length":
            cl = value
    if resp.status_code in (204, 304):
        return LengthBody(0)
    if b"chunked" in te:
        return ChunkedBody()
    if cl is not None:
        return LengthBody(int(cl))
    return LengthBody(None)


# --------------------------------------------------------------------------- one stream


@dataclass(slots=True)
class RawStream:
    """What one request observed, before classification. Times: absolute monotonic ns."""

    request_id: str
    t0_ns: int = 0
    end_ns: int = 0
    done_ns: int | None = None
    status: RequestStatus = RequestStatus.OK
    error: str | None = None
    http_status: int | None = None
    clock: ClockSource = ClockSource.USERSPACE
    ev_t: list[int] = field(default_factory=list)  # stamp per SSE event (kernel or user)
    ev_user_t: list[int] = field(default_factory=list)  # user-space stamp of the same read
    ev_bytes: list[int] = field(default_factory=list)
    ev_data: list[bytes | None] = field(default_factory=list)
    kernel_reads: int = 0
    user_reads: int = 0
    body_bytes: int = 0


class StreamRequest:
    """One streaming request. ``await run()`` returns its ``RawStream``; ``abort()`` ends it.

    ``addr`` is a resolved socket address (resolve once per run: DNS is not part of TTFT).
    """

    __slots__ = (
        "_addr", "_anc", "_body", "_bufsize", "_clock", "_conn", "_done", "_err_body", "_family",
        "_finished", "_in_io", "_kernel", "_loop", "_parser", "_reader_fd", "_req_bytes",
        "_sock", "_target", "_task", "_timeout_s", "_timer", "raw",
    )  # fmt: skip

    def __init__(
        self,
        target: Target,
        addr: tuple[Any, ...],
        family: int,
        path: str,
        body: bytes,
        headers: list[tuple[str, str]],
        *,
        request_id: str,
        timeout_s: float,
        clock: ClockMap,
        kernel_stamps: bool = True,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        bufsize: int = 65536,
    ) -> None:
        self._target = target
        self._addr = addr
        self._family = family
        self._timeout_s = timeout_s
        self._clock = clock
        self._kernel = kernel_stamps and not target.tls and kernel_stamps_supported()
        self._bufsize = bufsize
        self._anc = _ANCBUF if self._kernel else 0
        self._parser = SSEParser(max_event_bytes)
        self._conn = h11.Connection(h11.CLIENT)
        hdrs = [*headers, ("Content-Length", str(len(body)))]
        self._req_bytes = (
            self._conn.send(h11.Request(method="POST", target=path, headers=hdrs))
            + self._conn.send(h11.Data(data=body))
            + self._conn.send(h11.EndOfMessage())
        )
        self.raw = RawStream(request_id=request_id)
        self._err_body = bytearray()
        self._body: ChunkedBody | LengthBody | None = None
        self._finished = False
        self._in_io = False
        self._sock: socket.socket | None = None
        self._reader_fd = -1
        self._task: asyncio.Task[Any] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done: asyncio.Future[None] | None = None

    # ---- control

    def abort(self, status: RequestStatus, reason: str) -> None:
        """End the request now (timeout, run stopped); what was measured is kept."""
        self._finish(status, reason, time.monotonic_ns())

    def _on_timeout(self) -> None:
        r = self.raw
        phase = (
            "waiting for the response headers" if r.http_status is None else
            f"streaming ({len(r.ev_t)} events received)"
        )  # fmt: skip
        self._finish(
            RequestStatus.TIMEOUT,
            f"request timeout after {self._timeout_s:g} s, {phase}",
            time.monotonic_ns(),
        )

    def _finish(self, status: RequestStatus, error: str | None, t_ns: int) -> None:
        if self._finished:
            return
        self._finished = True
        r = self.raw
        r.status = status
        r.error = error
        r.end_ns = t_ns
        if self._reader_fd >= 0 and self._loop is not None:
            self._loop.remove_reader(self._reader_fd)
            self._reader_fd = -1
        if self._done is not None and not self._done.done():
            self._done.set_result(None)
        if self._in_io and self._task is not None:
            self._task.cancel()

    # ---- run

    async def run(self) -> RawStream:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._task = asyncio.current_task()
        self._done = loop.create_future()
        self._timer = loop.call_later(self._timeout_s, self._on_timeout)
        try:
            if self._target.tls:
                await self._run_tls()
            else:
                await self._run_plain(loop)
        finally:
            self._timer.cancel()
            if self._reader_fd >= 0:
                loop.remove_reader(self._reader_fd)
                self._reader_fd = -1
            if self._sock is not None:
                self._sock.close()
        r = self.raw
        if r.kernel_reads and not r.user_reads:
            r.clock = ClockSource.KERNEL
        return r

    def _swallow_own_cancel(self) -> bool:
        """True when a CancelledError came from our own ``_finish`` (timeout/abort)."""
        if self._finished and self._task is not None:
            self._task.uncancel()
            return True
        return False

    async def _run_plain(self, loop: asyncio.AbstractEventLoop) -> None:
        sock = socket.socket(self._family, socket.SOCK_STREAM)
        self._sock = sock
        sock.setblocking(False)
        if self._kernel:
            try:
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            except OSError:
                self._kernel = False
                self._anc = 0
        if self._family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.raw.t0_ns = time.monotonic_ns()
        self._in_io = True  # while set, _finish() cancels this task to end the await
        try:
            await loop.sock_connect(sock, self._addr)
            await loop.sock_sendall(sock, self._req_bytes)
        except asyncio.CancelledError:
            self._in_io = False
            if not self._swallow_own_cancel():
                raise
            return
        except OSError as e:
            self._in_io = False
            self._finish(RequestStatus.ERROR, _os_error("connect/send", e), time.monotonic_ns())
            return
        self._in_io = False
        if self._finished:
            return
        self._reader_fd = sock.fileno()
        loop.add_reader(self._reader_fd, self._on_readable)
        assert self._done is not None
        await self._done

    async def _run_tls(self) -> None:
        t = self._target
        ctx = ssl.create_default_context()
        self.raw.t0_ns = time.monotonic_ns()
        self._in_io = True
        writer: asyncio.StreamWriter | None = None
        try:
            reader, writer = await asyncio.open_connection(
                self._addr[0], self._addr[1], ssl=ctx, server_hostname=t.host
            )
            writer.write(self._req_bytes)
            await writer.drain()
            while not self._finished:
                data = await reader.read(self._bufsize)
                now = time.monotonic_ns()
                self.raw.user_reads += 1
                self._in_io = False
                self._on_data(data, now, now)
                self._in_io = True
        except asyncio.CancelledError:
            self._in_io = False
            if not self._swallow_own_cancel():
                raise
        except (OSError, ssl.SSLError) as e:
            self._in_io = False
            self._finish(RequestStatus.ERROR, _os_error("tls", e), time.monotonic_ns())
        finally:
            self._in_io = False
            if writer is not None:
                writer.close()

    # ---- the read callback (keep it small)

    def _on_readable(self) -> None:
        t_user = time.monotonic_ns()
        sock = self._sock
        assert sock is not None
        try:
            data, anc, _flags, _addr = sock.recvmsg(self._bufsize, self._anc)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._finish(RequestStatus.ERROR, _os_error("read", e), t_user)
            return
        stamp = t_user
        if anc:
            for level, typ, cdata in anc:
                if level == socket.SOL_SOCKET and typ == SCM_TIMESTAMPNS:
                    sec, nsec = _TIMESPEC.unpack_from(cdata)
                    k = sec * 1_000_000_000 + nsec - self._clock.offset_ns
                    stamp = k if k < t_user else t_user
            self.raw.kernel_reads += 1
        elif data:  # an EOF read carries no segment, hence no kernel stamp: not counted
            self.raw.user_reads += 1
        self._on_data(data, stamp, t_user)

    def _on_data(self, data: bytes, stamp: int, t_user: int) -> None:
        body = self._body
        try:
            if body is None:  # response head: h11 parses it, then hands over the rest
                data = self._on_head(data)
                body = self._body
                if body is None:
                    return
                if not data:  # nothing after the head in this read
                    if body.done:
                        self._end_of_body(stamp)
                    return
            if not data:
                if isinstance(body, LengthBody) and body.until_close:
                    self._end_of_body(stamp)
                else:
                    n = len(self.raw.ev_t)
                    msg = f"connection closed mid-stream ({n} events received)"
                    self._finish(RequestStatus.ERROR, msg, stamp)
                return
            payload = body.feed(data)
            if payload:
                self._on_body(payload, stamp, t_user)
            if body.done and not self._finished:
                self._end_of_body(stamp)
        except h11.RemoteProtocolError as e:
            if not data:
                msg = "server closed the connection without a response"
            else:
                msg = f"HTTP protocol error: {e}"
            self._finish(RequestStatus.ERROR, msg, stamp)
        except (SSEEventTooLarge, BodyError) as e:
            self._finish(RequestStatus.ERROR, str(e), stamp)
        except Exception as e:  # never let a callback die silently: the stream would hang
            self._finish(RequestStatus.ERROR, f"client error: {e!r}", stamp)

    def _on_head(self, data: bytes) -> bytes:
        """Feed h11 until the final response head; return the body bytes that followed it."""
        conn = self._conn
        conn.receive_data(data)
        while True:
            ev = conn.next_event()
            if ev is h11.NEED_DATA or ev is h11.PAUSED:
                return b""
            if isinstance(ev, h11.Response):
                self.raw.http_status = ev.status_code
                self._body = body_decoder(ev)
                rest, closed = conn.trailing_data
                return bytes(rest) if rest or not closed else b""
            # InformationalResponse (1xx): keep reading

    def _on_body(self, chunk: bytes, stamp: int, t_user: int) -> None:
        r = self.raw
        if type(chunk) is not bytes:
            chunk = bytes(chunk)  # h11 hands out bytearray slices
        r.body_bytes += len(chunk)
        if r.http_status != 200:
            room = _ERROR_BODY_CAP - len(self._err_body)
            if room > 0:
                self._err_body += chunk[:room]
            return
        for data, nbytes in self._parser.feed(chunk):
            r.ev_t.append(stamp)
            r.ev_user_t.append(t_user)
            r.ev_bytes.append(nbytes)
            r.ev_data.append(data)
            if data == _DONE:
                r.done_ns = stamp
                self._finish(RequestStatus.OK, None, stamp)
                return

    def _end_of_body(self, stamp: int) -> None:
        r = self.raw
        if r.http_status != 200:
            body = snippet(bytes(self._err_body))
            self._finish(RequestStatus.ERROR, f"HTTP {r.http_status}: {body}", stamp)
            return
        for data, nbytes in self._parser.flush():
            r.ev_t.append(stamp)
            r.ev_user_t.append(stamp)
            r.ev_bytes.append(nbytes)
            r.ev_data.append(data)
        r.done_ns = stamp
        self._finish(RequestStatus.OK, None, stamp)


def _os_error(phase: str, e: BaseException) -> str:
    if isinstance(e, ConnectionRefusedError):
        return f"connection refused ({phase})"
    if isinstance(e, ConnectionResetError):
        return f"connection reset by peer ({phase})"
    return f"{phase} failed: {e.__class__.__name__}: {e}"


async def resolve(target: Target) -> tuple[int, tuple[Any, ...]]:
    """Resolve the target once: ``(family, sockaddr)``."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    if not infos:
        raise OSError(f"cannot resolve {target.host}")
    family, _type, _proto, _canon, sockaddr = infos[0]
    return int(family), tuple(sockaddr)
