"""What the client sends: the target (``parse_target``) and a path on it (``Target.url_path``),
a request's headers (``request_headers``) and its bytes, formatted once before the request
is due (``build_request``; ``request_head`` + ``finish_request`` for a body known later). Its
JSON body is its API surface's (``app.client.endpoints``). ``is_json_type`` tells a JSON
answer from an event stream.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

USER_AGENT = "tokentrace/0.1"


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

    def url_path(self, path: str) -> str:
        """A surface's path from the server's root (``/v1/chat/completions``) under the
        target's base path: a base ending in ``/v1`` is the API root's ``/v1``."""
        root = self.base_path[:-3] if self.base_path.endswith("/v1") else self.base_path
        return root + path


_default_contexts: dict[tuple[str | None, str | None], ssl.SSLContext] = {}


def default_ssl_context() -> ssl.SSLContext:
    """``ssl.create_default_context()`` (verification on), made once and shared: loading the
    trust store takes milliseconds, too long to do per request. Keyed by ``SSL_CERT_FILE`` /
    ``SSL_CERT_DIR``, which OpenSSL reads when the context is made."""
    key = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    ctx = _default_contexts.get(key)
    if ctx is None:
        ctx = _default_contexts[key] = ssl.create_default_context()
    return ctx


def parse_target(base_url: str) -> Target:
    u = urlsplit(base_url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"unsupported target URL {base_url!r}")
    port = u.port or (443 if u.scheme == "https" else 80)
    return Target(u.scheme, u.hostname, port, u.path.rstrip("/"))


def is_json_type(content_type: str | None) -> bool:
    """A JSON response (``application/json``, ``application/<x>+json``), not an SSE stream."""
    if content_type is None:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def request_headers(
    target: Target,
    request_id: str,
    api_key: str | None,
    *,
    keep_alive: bool = True,
    extra: Mapping[str, str] | None = None,
    stream: bool = True,
    surface: Sequence[tuple[str, str]] = (),
    key_header: str | None = None,
) -> list[tuple[str, str]]:
    """The request's headers; ``extra`` (the run's ``headers``) after the client's own, an
    ``Accept`` or ``User-Agent`` there replacing the client's. ``surface``: the API
    surface's own headers (``anthropic-version``; ``extra`` may replace them too);
    ``key_header``: the header the key goes in as is (``x-api-key``), instead of
    ``Authorization: Bearer``."""
    headers = [
        ("Host", target.host_header),
        ("User-Agent", USER_AGENT),
        ("Content-Type", "application/json"),
        ("Accept", "text/event-stream" if stream else "application/json"),
        ("Connection", "keep-alive" if keep_alive else "close"),
        ("X-Request-Id", request_id),
        *surface,
    ]
    if extra:
        own = {k.lower() for k in extra}
        headers = [(k, v) for k, v in headers if k.lower() not in own]
        headers.extend(extra.items())
    if api_key:
        key = (key_header, api_key) if key_header else ("Authorization", f"Bearer {api_key}")
        headers.append(key)
    return headers


# --------------------------------------------------------------------------- bodies


def request_head(path: str, headers: list[tuple[str, str]]) -> bytes:
    """The request line and ``headers``, each line ending in CRLF: everything before the
    ``Content-Length`` line (``finish_request`` adds it and the body)."""
    lines = [f"POST {path} HTTP/1.1"]
    for k, v in headers:
        if "\r" in v or "\n" in v or "\r" in k or "\n" in k or ":" in k:
            raise ValueError(f"invalid header {k!r}")
        lines.append(f"{k}: {v}")
    return ("\r\n".join(lines) + "\r\n").encode("latin-1")


def finish_request(head: bytes, body: bytes) -> bytes:
    """``head`` (``request_head``) + ``Content-Length`` + the blank line + ``body``."""
    return b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body)


def build_request(path: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    """The HTTP/1.1 request bytes (fixed and simple: no h11 needed)."""
    return finish_request(request_head(path, headers), body)
