"""A hostile target for tests and benchmarks: answers that never end, or are enormous
(issue 23, item 6). One threaded HTTP/1.1 server on loopback (keep-alive, real sockets);
what a request gets depends on the first segment of its path, so a run's ``base_url`` picks
the flood: ``http://127.0.0.1:PORT/<mode>``.

* ``endless``: a 200 event stream of valid content events (" word", one token each), sent
  in 64 KiB chunks until the client goes away;
* ``bigevent``: a 200 event stream of 8 MiB events, each one valid JSON, forever;
* ``tiny``: valid content events of 36 bytes, forever (as many events per byte as a server
  can make);
* ``valid<N>`` (e.g. ``valid60``): a valid stream of about N MB of content events, then a
  usage event and ``[DONE]``: ``valid_events(N)`` events, one token each;
* ``error``: HTTP 500 with an endless body; ``json``: a 200 JSON answer that never ends;
* ``streams``: chat requests get ``endless``, ``bigevent`` and ``tiny`` in turn;
* ``mixed``: the same, and ``/metrics`` (Prometheus text) and ``/v1/models`` (a JSON model
  list) never end either; ``sideband``: those two never end, chat requests get ``valid1``.
  In the other modes they answer normally.

``python -m tests.flood_target --port P`` serves until killed (the benchmark runs it in its
own process, so its memory is not the worker's).
"""

from __future__ import annotations

import argparse
import itertools
import socket
import socketserver
import threading
from types import TracebackType

CONTENT = b'data: {"choices":[{"index":0,"delta":{"content":" word"}}]}\n\n'
TINY = b'data:{"choices":[{"text":" a"}]}\n\n'
DONE = b"data: [DONE]\n\n"
BLOCK = 64 << 10
BIG_EVENT = 8 << 20
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
MIXED = ("endless", "bigevent", "tiny")


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def valid_events(mb: int) -> int:
    """How many content events a ``valid<mb>`` answer has (each one token)."""
    return mb * 1_000_000 // len(CONTENT)


def _repeat(unit: bytes, size: int = BLOCK) -> bytes:
    return unit * max(1, size // len(unit))


_ENDLESS = chunk(_repeat(CONTENT))
_TINY = chunk(_repeat(TINY))
_BIG = chunk(
    b'data: {"choices":[{"index":0,"delta":{"content":"' + b"x" * (BIG_EVENT - 60) + b'"}}]}\n\n'
)
_METRICS_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\n\r\n"
_METRIC_LINE = b'vllm:num_requests_running{model_name="m",x="flood"} 1\n'
_METRICS = _repeat(_METRIC_LINE)
_MODELS_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n"
_MODELS = _repeat(b'{"id":"m","object":"model"},')
_ERROR_HEAD = b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/html\r\n\r\n"
_JSON_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n"
_FILL = _repeat(b"x")


class _Handler(socketserver.BaseRequestHandler):
    server: FloodServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        try:
            while not self.server.stopping.is_set():
                while b"\r\n\r\n" not in buf:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                length = 0
                for ln in lines[1:]:
                    k, _, v = ln.partition(":")
                    if k.strip().lower() == "content-length":
                        length = int(v)
                while len(buf) < length:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buf += data
                buf = buf[length:]
                if not self._answer(sock, path):
                    return
        except OSError:  # the client went away: the flood ends
            return

    def _forever(self, sock: socket.socket, head: bytes, block: bytes) -> bool:
        sock.sendall(head)
        while not self.server.stopping.is_set():
            sock.sendall(block)
        return False

    def _answer(self, sock: socket.socket, path: str) -> bool:
        """Answer one request; False when the connection is done."""
        srv = self.server
        mode = path.strip("/").split("/", 1)[0]
        if path.endswith(("/metrics", "/v1/models")):
            if mode not in ("mixed", "sideband"):
                body = b'{"data":[{"id":"m"}]}' if path.endswith("models") else _METRIC_LINE
                sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
                return True
            if path.endswith("/metrics"):
                return self._forever(sock, _METRICS_HEAD, _METRICS)
            return self._forever(sock, _MODELS_HEAD + b'{"data":[', _MODELS)
        if mode in ("mixed", "streams"):
            mode = MIXED[next(srv.counter) % len(MIXED)]
        elif mode == "sideband":
            mode = "valid1"
        with srv.lock:
            srv.requests[mode] = srv.requests.get(mode, 0) + 1
        if mode == "endless":
            return self._forever(sock, SSE_HEAD, _ENDLESS)
        if mode == "tiny":
            return self._forever(sock, SSE_HEAD, _TINY)
        if mode == "bigevent":
            return self._forever(sock, SSE_HEAD, _BIG)
        if mode == "error":
            return self._forever(sock, _ERROR_HEAD, _FILL)
        if mode == "json":
            return self._forever(sock, _JSON_HEAD + b'{"choices":[{"message":{"content":"', _FILL)
        if mode.startswith("valid"):
            n = valid_events(int(mode.removeprefix("valid")))
            sock.sendall(SSE_HEAD)
            per = BLOCK // len(CONTENT)
            full = chunk(CONTENT * per)
            for _ in range(n // per):
                sock.sendall(full)
            if n % per:
                sock.sendall(chunk(CONTENT * (n % per)))
            usage = b'data: {"choices":[],"usage":{"completion_tokens":%d}}\n\n' % n
            sock.sendall(chunk(usage + DONE) + b"0\r\n\r\n")
            return True
        sock.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
        return True


class FloodServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.stopping = threading.Event()
        self.counter = itertools.count()
        self.lock = threading.Lock()
        self.requests: dict[str, int] = {}  # chat requests answered, by mode
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> FloodServer:
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.shutdown()
        self.server_close()

    def __enter__(self) -> FloodServer:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--port", type=int, required=True)
    port = ap.parse_args().port
    srv = FloodServer(port)
    print(f"flooding on {srv.url}", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
