"""A token (or a sign-in) is checked before a request body is read, on every route that takes
one, over real HTTP: the request's headers go out, the body never does, and the server must
answer (401/403) all the same. A server that reads the body first waits for it and the
read below times out. Bodies of unknown length are counted as they stream, never held."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest
from fastapi.routing import APIRoute

from app.api.app import create_app
from app.api.auth_first import scope_for
from app.api.deps import Require
from app.settings import Settings
from app.web.launch import MAX_FORM_BYTES
from tests.live_server import LiveServer, LiveServerFactory

ANSWER_TIMEOUT_S = 15.0  # the server answers from the headers alone; it never gets a body
BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
ANONYMOUS_FORMS = {"/signin", "/signout"}  # read while signed out, bounded (test below)
DEFAULTS = Settings(local_worker=False)


@dataclass(frozen=True)
class Answer:
    status: int
    head: bytes


def _answer(sock: socket.socket) -> Answer:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head = data.split(b"\r\n\r\n", 1)[0]
    return Answer(int(head.split(b" ", 2)[1]), head)


def send_headers(
    srv: LiveServer, method: str, path: str, headers: dict[str, str], body_start: bytes = b""
) -> Answer:
    """Send the request line and headers (and ``body_start``), never the rest of the body,
    and read the answer."""
    port = urlsplit(srv.url).port
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_TIMEOUT_S) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body_start)
        try:
            return _answer(s)
        except TimeoutError:
            pytest.fail(f"{method} {path}: no answer without the body: the server waits for it")


def _limit(path: str) -> int:
    if re.fullmatch(r"/api/v1/jobs/[^/]+/results", path):
        return DEFAULTS.max_upload_bytes
    if path in ("/api/v1/imports", "/import"):
        return DEFAULTS.max_import_bytes
    return DEFAULTS.max_body_bytes


def _content_type(path: str) -> str:
    if path in ("/api/v1/imports", "/import"):
        return "multipart/form-data; boundary=tokentrace-boundary"
    return "application/json" if path.startswith("/api/") else "application/x-www-form-urlencoded"


def api_routes(routes: list[Any]) -> Iterator[APIRoute]:
    """Every ``APIRoute`` of the app, those of included routers too."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        inner = getattr(route, "original_router", None)  # an included router
        if inner is not None:
            yield from api_routes(list(inner.routes))


def body_routes() -> Iterator[tuple[str, str, APIRoute]]:
    """(method, path with its parameters filled, route) of every route that may take a
    body."""
    app = create_app(Settings(database_url="sqlite://", local_worker=False))
    for route in api_routes(list(app.routes)):
        for method in sorted(route.methods & BODY_METHODS):
            yield method, re.sub(r"\{[^}]+\}", "0", route.path), route


@pytest.fixture(scope="module")
def server(module_db_url: str, module_live_server: LiveServerFactory) -> LiveServer:
    """One server per database for the module: each test only sends requests it refuses,
    with tokens of its own (one bad token in all, far below the failure limit)."""
    return module_live_server(module_db_url)


def test_every_body_route_answers_before_reading_the_body(server: LiveServer) -> None:
    routes = [(m, p) for m, p, _ in body_routes()]
    api = [(m, p) for m, p in routes if p.startswith("/api/")]
    pages = [(m, p) for m, p in routes if not p.startswith("/api/") and p not in ANONYMOUS_FORMS]
    assert len(api) >= 25 and len(pages) >= 10, routes
    assert ("POST", "/api/v1/jobs/0/results") in api and ("POST", "/api/v1/imports") in api
    for method, path in api + pages:
        headers = {"Content-Length": str(_limit(path)), "Content-Type": _content_type(path)}
        got = send_headers(server, method, path, headers)
        if path.startswith("/api/"):  # anonymous: 401, as the route's own check says
            assert got.status == 401, (method, path, got.head)
            assert b"www-authenticate: Bearer" in got.head.lower().replace(b"bearer", b"Bearer")
        else:  # a page's form post, signed out: refused (403, or 404 for the made-up id)
            assert got.status in (403, 404), (method, path, got.head)


def test_a_token_without_the_scope_is_refused_before_the_body(server: LiveServer) -> None:
    read = server.create_token("read")
    for path, scope in (("/api/v1/jobs/0/results", "worker"), ("/api/v1/imports", "run")):
        assert scope_for("POST", path) == scope
        headers = {
            "Authorization": f"Bearer {read}",
            "Content-Length": str(_limit(path)),
            "Content-Type": _content_type(path),
        }
        got = send_headers(server, "POST", path, headers)
        assert got.status == 403, (path, got.head)
    bad = {"Authorization": "Bearer tt_not-a-token", "Content-Length": str(64 * 1024 * 1024)}
    assert send_headers(server, "POST", "/api/v1/jobs/0/results", bad).status == 401


def test_anonymous_chunked_upload_is_refused_at_its_first_chunk(server: LiveServer) -> None:
    """The issue's case: a chunked multipart upload to /api/v1/imports was held whole (up
    to the 256 MiB import limit) before the token was looked at."""
    chunk = b"x" * 4096
    first = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"  # and never a last chunk
    for path in ("/api/v1/imports", "/api/v1/jobs/0/results", "/api/v1/runs"):
        headers = {"Transfer-Encoding": "chunked", "Content-Type": _content_type(path)}
        assert send_headers(server, "POST", path, headers, first).status == 401, path


def test_signed_out_forms_read_a_bounded_body(server: LiveServer) -> None:
    """Sign-in and sign-out are posted signed out: each reads at most ``MAX_FORM_BYTES``
    (then refuses the form) instead of waiting for a body of any length."""
    chunk = b"a" * (MAX_FORM_BYTES + 1)
    first = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"  # and the body goes on
    headers = {"Transfer-Encoding": "chunked", "Content-Type": "application/x-www-form-urlencoded"}
    for path in sorted(ANONYMOUS_FORMS):
        assert send_headers(server, "POST", path, headers, first).status == 403, path


def _required(route: APIRoute) -> str | None:
    stack = [route.dependant]
    while stack:
        dep = stack.pop()
        if isinstance(dep.call, Require):
            return dep.call.scope
        stack.extend(dep.dependencies)
    return None


def test_the_scope_checked_first_is_each_routes_own() -> None:
    """``AuthFirst`` checks, before the body, the scope each API write's own ``require``
    dependency asks for: a new write route needs both (a route without a token check, or
    one the table gives another scope, fails here)."""
    seen = 0
    for method, path, route in body_routes():
        if path.startswith("/api/"):
            assert _required(route) is not None, (method, route.path)
            assert scope_for(method, path) == _required(route), (method, route.path)
            seen += 1
        else:  # pages: signed in by cookie, checked by the handler before its form
            assert scope_for(method, path) is None, path
    assert seen >= 25


def test_a_signed_in_body_over_its_routes_limit_is_413_naming_the_setting(
    server: LiveServer,
) -> None:
    """A caller with the scope still gets no more than the route's limit read: a chunked
    body is cut at the limit with a 413 that names the limit and its setting."""
    run = server.create_token("run")
    chunk = b"x" * (DEFAULTS.max_body_bytes + 1)
    first = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"  # and the body goes on
    headers = {
        "Authorization": f"Bearer {run}",
        "Transfer-Encoding": "chunked",
        "Content-Type": "application/json",
    }
    got = send_headers(server, "POST", "/api/v1/runs", headers, first)
    assert got.status == 413, got.head
    declared = headers | {"Content-Length": str(DEFAULTS.max_upload_bytes + 1)}
    del declared["Transfer-Encoding"]
    worker = server.create_token("worker")
    declared["Authorization"] = f"Bearer {worker}"
    port = urlsplit(server.url).port
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_TIMEOUT_S) as s:
        head = ["POST /api/v1/jobs/0/results HTTP/1.1", f"Host: 127.0.0.1:{port}"]
        head += [f"{k}: {v}" for k, v in declared.items()]
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        body = b""
        while True:
            part = s.recv(65536)
            if not part:
                break
            body += part
    assert b" 413 " in body.split(b"\r\n", 1)[0]
    assert f"{DEFAULTS.max_upload_bytes}-byte limit".encode() in body
    assert b"TOKENTRACE_MAX_UPLOAD_BYTES" in body
