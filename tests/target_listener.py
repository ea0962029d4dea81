"""``Listener``: a loopback HTTP target on its own thread that records what reached it (each
request's method, path and ``Authorization`` header) and answers as an OpenAI-style server
would: a short chat/completions stream, a model list, an empty ``/metrics``. For tests of
what a run sends where, from any process (a worker subprocess included)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import NamedTuple


class Seen(NamedTuple):
    method: str
    path: str
    authorization: str | None


def _sse(*objs: object) -> bytes:
    return b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs) + (
        b"data: [DONE]\n\n"
    )


STREAM = _sse(
    {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
    {"choices": [{"index": 0, "delta": {"content": "the"}}]},
    {"choices": [{"index": 0, "delta": {"content": " end"}, "finish_reason": "length"}]},
)


class Listener:
    """``fail_first``: the first that many POSTs are answered ``fail_status`` (a webhook
    that fails, then recovers); every POST's body is kept (``bodies``)."""

    def __init__(self, *, fail_first: int = 0, fail_status: int = 500) -> None:
        self.seen: list[Seen] = []
        self.bodies: list[bytes] = []
        self.fail_first = fail_first
        self.fail_status = fail_status
        self._lock = threading.Lock()
        listener = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def _record(self) -> None:
                with listener._lock:
                    listener.seen.append(
                        Seen(self.command, self.path, self.headers.get("Authorization"))
                    )

            def _answer(self, ctype: str, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._record()
                if self.path.endswith("/models"):
                    self._answer("application/json", b'{"data": [{"id": "m"}]}')
                else:
                    self._answer("text/plain; version=0.0.4", b"# nothing here\n")

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._record()
                with listener._lock:
                    listener.bodies.append(body)
                    failing = len(listener.bodies) <= listener.fail_first
                if failing:
                    self.send_response(listener.fail_status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self._answer("text/event-stream", STREAM)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Listener:
        self._thread.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def requests(self) -> list[Seen]:
        with self._lock:
            return list(self.seen)

    def posted(self) -> list[bytes]:
        with self._lock:
            return list(self.bodies)

    def bearers(self) -> set[str | None]:
        return {s.authorization for s in self.requests()}
