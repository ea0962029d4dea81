"""The simulator writes a whole response's head by hand (``HttpProtocol.send_simple``): it
says what h11 would write for the same response (status, headers, body), keep-alive and
close alike."""

from __future__ import annotations

import asyncio
from typing import Any

import h11
import pytest

from app.targets.sim_config import SimConfig
from app.targets.simulator.http import HttpProtocol


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.out += data

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class _Server:
    def __init__(self, reply: tuple[int, bytes]) -> None:
        self.config = SimConfig()
        self.clock_offset_ns = 0
        self.reply = reply

    def track(self, proto: HttpProtocol) -> None:
        pass

    def untrack(self, proto: HttpProtocol) -> None:
        pass

    def handle(self, proto: HttpProtocol, req: h11.Request, body: bytes, received_ns: int) -> None:
        proto.request_id = "rid-7"
        proto.send_simple(*self.reply)


def _parsed(raw: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """(status, headers lower-cased and sorted, body) as a client reads them."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="POST", target="/", headers=[("host", "sim")]))
    conn.receive_data(raw)
    status, headers, body = 0, [], bytearray()
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Response):
            status, headers = event.status_code, sorted((k.lower(), v) for k, v in event.headers)
        elif isinstance(event, h11.Data):
            body += event.data
        else:
            break
    return status, headers, bytes(body)


def _serve(proto: HttpProtocol, transport: _Transport, request: bytes) -> None:
    async def go() -> None:
        proto.connection_made(transport)
        proto.data_received(request)

    asyncio.run(go())


def _h11_bytes(request: bytes, status: int, body: bytes, close: bool) -> bytes:
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(request)
    assert isinstance(conn.next_event(), h11.Request)
    while not isinstance(conn.next_event(), h11.EndOfMessage):
        pass
    headers = [("server", "tokentrace-sim")]
    if close:
        headers.append(("connection", "close"))
    headers += [("content-type", "application/json"), ("content-length", str(len(body)))]
    headers.append(("x-request-id", "rid-7"))
    out = conn.send(h11.Response(status_code=status, headers=headers)) or b""
    return out + (conn.send(h11.Data(data=body)) or b"") + (conn.send(h11.EndOfMessage()) or b"")


@pytest.mark.parametrize("close", [False, True])
@pytest.mark.parametrize("status", [200, 404, 500])
def test_a_whole_response_is_what_h11_writes(close: bool, status: int) -> None:
    body = b'{"object":"list","data":[]}'
    request = b"POST /v1/embeddings HTTP/1.1\r\nhost: sim\r\ncontent-length: 2\r\n"
    request += (b"connection: close\r\n" if close else b"") + b"\r\n{}"
    proto = HttpProtocol(_Server((status, body)))  # type: ignore[arg-type]
    transport = _Transport()
    _serve(proto, transport, request)
    out = bytes(transport.out)
    assert out.startswith(b"HTTP/1.1 %d \r\n" % status)
    assert _parsed(out) == _parsed(_h11_bytes(request, status, body, close))
    assert transport.closed is close
    assert proto.served == 1
