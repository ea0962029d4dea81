"""A GET whose answer the client bounds: at most ``max_bytes`` of body, ``deadline_s`` seconds
in all (``get_bounded``).

httpx's timeouts bound each read, not the answer: a target whose ``/metrics`` or
``/v1/models`` never ends (or trickles a byte a second) would be read forever, and
``response.content`` holds all of it. Here the body is read a piece at a time and the
request given up, with a reason, past either bound. The body is asked for uncompressed
(``Accept-Encoding: identity``) and a compressed one refused: a few KB of gzip can inflate
to gigabytes in one piece.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx


@dataclass(frozen=True, slots=True)
class BoundedAnswer:
    status: int
    content_type: str  # the media type only ("no content type" when the header is missing)
    body: bytes | None  # None when a bound was passed (``error`` says which)
    error: str | None = None


def get_bounded(
    client: httpx.Client,
    url: str,
    *,
    max_bytes: int,
    deadline_s: float,
    method: str = "GET",
    timeout_s: float | None = None,
) -> BoundedAnswer:
    """GET ``url`` (or ``method``: a control's POST, with no body; ``timeout_s``: httpx's
    timeouts for this request, else the client's); transport errors (``httpx.HTTPError``)
    propagate."""
    deadline = time.monotonic() + deadline_s
    headers = {"Accept-Encoding": "identity"}
    timeout = client.timeout if timeout_s is None else httpx.Timeout(timeout_s)
    with client.stream(method, url, headers=headers, timeout=timeout) as resp:
        ctype = resp.headers.get("content-type", "no content type").split(";")[0].strip()[:60]
        encoding = resp.headers.get("content-encoding", "identity").strip().lower()
        if encoding != "identity":
            why = f"a compressed answer ({encoding[:20]!r}) not asked for"
            return BoundedAnswer(resp.status_code, ctype, None, why)
        parts: list[bytes] = []
        size = 0
        for piece in resp.iter_raw():
            size += len(piece)
            if size > max_bytes:
                return BoundedAnswer(
                    resp.status_code, ctype, None, f"answer larger than {max_bytes:,} bytes"
                )
            parts.append(piece)
            if time.monotonic() > deadline:
                return BoundedAnswer(
                    resp.status_code, ctype, None, f"answer took longer than {deadline_s:g} s"
                )
        return BoundedAnswer(resp.status_code, ctype, b"".join(parts))
