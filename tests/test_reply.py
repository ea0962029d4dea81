"""The next turn's pieces (app.client.sessions): the reply text, decoded where the reply
ended by the one decoder (``RawStream.finalize``) and classified once (``reply_text``: its
classification is the record's), whatever the framing and however the reads were cut; the
body built from the serialised history must be the surface's own body bytes."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import numpy as np
import pytest

from app.client.clocks import ClockMap
from app.client.events import Classifier
from app.client.http_request import (
    build_request,
    finish_request,
    parse_target,
    request_head,
    request_headers,
)
from app.client.http_stream import StreamRequest
from app.client.raw_stream import RawStream
from app.client.records import record_steps
from app.client.sessions import History, body_template, dumps, reply_text
from app.client.spec import RunSpec
from app.client.tokenizer import BuiltinTokenizer
from tests.endpoint_support import body_of
from tests.test_client import SSE_HEAD, chunk, content_ev, ev

TARGET = parse_target("http://127.0.0.1:9/v1")
CLOCK = ClockMap()


def capture(response: bytes, cuts: list[int]) -> RawStream:
    """``response`` through the read callback's bookkeeping, read by read (reads end at
    ``cuts``), as the socket callback captures it (nothing decoded)."""
    sr = StreamRequest(
        TARGET, ("127.0.0.1", 9), 2, "/v1/chat/completions", b"", [],
        request_id="x", timeout_s=5, clock=CLOCK, request_bytes=b"x",
    )  # fmt: skip
    t = 1_000
    prev = 0
    # "[DONE]" before the body's end arms a timer on the stream's loop (never run here)
    loop = sr._loop = asyncio.new_event_loop()
    try:
        for end in [*cuts, len(response)]:
            if end <= prev:
                continue
            r = sr.raw
            old = len(r.buf)
            r.buf += response[prev:end]
            t += 1_000
            sr._took(old, end - prev, t, t)
            prev = end
            if r.end_ns:  # the stream ended: the socket is no longer read
                break
        if not sr.raw.end_ns:  # the server closed the connection
            sr._on_eof(t + 1)
    finally:
        loop.close()
    return sr.raw


def chat(text: str) -> bytes:
    return content_ev(text, True)


ROLE = ev({"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]})
USAGE = ev({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}})
DONE = b"data: [DONE]\n\n"
EVENTS = [ROLE, chat("Hello"), chat(' w\u00f6rld \\ "q"'), chat(" \U0001f600"), USAGE, DONE]
LEN_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
CLOSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"


def chunked(events: list[bytes], per_chunk: int = 1, ext: bytes = b"") -> bytes:
    body = b""
    for i in range(0, len(events), per_chunk):
        part = b"".join(events[i : i + per_chunk])
        body += b"%x%s\r\n%s\r\n" % (len(part), ext, part)
    return SSE_HEAD + body + b"0\r\n\r\n"


def length_framed(events: list[bytes]) -> bytes:
    body = b"".join(events)
    return LEN_HEAD % len(body) + body


TEXT = 'Hello w\u00f6rld \\ "q" \U0001f600'
# response -> the reply a next turn carries (None: the turn failed), read off the events
# above by hand
CASES: dict[str, tuple[bytes, str | None]] = {
    "chunked": (chunked(EVENTS), TEXT),
    "several events a chunk": (chunked(EVENTS, per_chunk=4), TEXT),
    "chunk extension": (chunked(EVENTS, ext=b";x=1"), TEXT),
    "content-length": (length_framed(EVENTS), TEXT),
    "until close": (CLOSE_HEAD + b"".join(EVENTS), TEXT),
    "keep-alive comments": (
        chunked([b": ping\n\n", *EVENTS[:3], b": ping\n\n", *EVENTS[3:]]),
        TEXT,
    ),
    "reasoning first": (
        chunked([ev({"choices": [{"delta": {"reasoning_content": "think"}}]}), *EVENTS[1:]]),
        TEXT,  # reasoning left out
    ),
    "events after done": (chunked([*EVENTS, chat("after")]), TEXT),
    "error event": (chunked([ROLE, chat("a"), ev({"error": {"message": "boom"}}), DONE]), None),
    "non-JSON data": (chunked([ROLE, chat("a"), b"data: {oops\n\n", DONE]), None),
    "no token": (chunked([ROLE, USAGE, DONE]), None),
    "lone separators": (chunked([ROLE, b"\n", chat("x"), b"\n\n", chat("y"), DONE]), "xy"),
    "multi-line data": (
        chunked([ROLE, b'data: {"choices":\ndata: []}\n\n', chat("z"), DONE]),
        "z",
    ),
    "CRLF events": (chunked([e.replace(b"\n", b"\r\n") for e in EVENTS]), TEXT),
    "no [DONE]": (chunked(EVENTS[:-1]), TEXT),
    "cut short": ((SSE_HEAD + chunked(EVENTS)[len(SSE_HEAD) :])[:-60], None),
    "http 500": (b"HTTP/1.1 500 Oops\r\nContent-Length: 2\r\n\r\n{}", None),
    "json answer": (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 60"
        b"\r\n\r\n" + b'{"choices":[{"message":{"content":"whole"}}],"usage":null}    ',
        "whole",
    ),
    "bad chunk size": (SSE_HEAD + b"zz\r\n" + b"".join(EVENTS), None),
    "bad chunk end": (
        SSE_HEAD + chunk(EVENTS[1])[:-2] + b"XX" + chunked(EVENTS)[len(SSE_HEAD) :],
        None,
    ),
}


def cut_sets(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    every = list(range(1, n))
    return [[], every] + [sorted(rng.sample(every, k)) for k in (1, 3, 10, 40) if k < n]


def record(raw: RawStream) -> Any:
    steps = record_steps(
        raw, index=0, scheduled_ns=0, run_start_ns=0, tokenizer=BuiltinTokenizer(),
        token_counting="auto",
    )  # fmt: skip
    try:
        while True:
            next(steps)
    except StopIteration as stop:
        return stop.value


def same_records(a: Any, b: Any) -> bool:
    fields = ("status", "error", "output_tokens", "tokenizer_output_tokens", "token_source")
    fields += ("usage_prompt_tokens", "usage_completion_tokens", "sent_ns", "end_ns")
    arrays = ("event_t_ns", "event_bytes", "event_kind", "event_tokens")
    return all(getattr(a, f) == getattr(b, f) for f in fields) and all(
        np.array_equal(getattr(a, f), getattr(b, f)) for f in arrays
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_reply_is_read_off_the_decoded_stream(name: str) -> None:
    """Whatever the framing and however the reads were cut, the reply is the one read off
    the events by hand; the record built after it (reusing its classification) is the
    record built from scratch."""
    response, expected = CASES[name]
    for i, cuts in enumerate(cut_sets(len(response), seed=hash(name) & 0xFFFF)):
        raw = capture(response, cuts)
        assert reply_text(raw, Classifier().classify) == expected, (name, i)
        if raw.status.value == "ok":
            assert raw.ev_classified is not None and len(raw.ev_classified) == len(raw.ev_t)
        assert same_records(record(raw), record(capture(response, cuts))), (name, i)


def test_an_oversized_event_fails_the_reply() -> None:
    """The run's event cap holds for a reply decoded where it ended, as for any stream."""
    response = chunked([ROLE, chat("x" * 5000), DONE])
    raw = capture(response, list(range(100, len(response), 700)))
    raw.max_event_bytes = 1024  # as a run's cap would be
    assert reply_text(raw, Classifier().classify) is None
    assert "larger than 1024 bytes" in (raw.error or "")
    assert reply_text(capture(response, [200]), Classifier().classify) == "x" * 5000


def spec(**kw: Any) -> RunSpec:
    base: dict[str, Any] = {
        "base_url": "http://127.0.0.1:9/v1",
        "model": "m\u00e9",
        "dataset": "jsonl",
        "dataset_path": "/nonexistent.jsonl",
        "multi_turn": True,
        "scrape_metrics": False,
    }
    return RunSpec(**(base | kw))


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"ignore_eos": True},
        {"extra_body": {"temperature": 0.5, "chat_template_kwargs": {"x": ["\u00fc", 1]}}},
        {"extra_body": {"messages": [{"role": "user", "content": "replaced"}]}},
        {"extra_body": {"note": ["\u0000tokentrace-history\u0000"]}},  # the marker twice
    ],
)
def test_history_body_is_request_bodys_bytes(kw: dict[str, Any]) -> None:
    sp = spec(**kw)
    tok = BuiltinTokenizer()
    system = [{"role": "system", "content": "be brief \u2603"}]
    for sys_msgs in ([], system):
        h = History(sys_msgs, tok)
        messages: list[dict[str, Any]] = list(sys_msgs)
        for k, (user, reply) in enumerate(
            [('hi "there"', "ok\n\u00e9"), ("more\t\\", "\U0001f600 end"), ("last", "")]
        ):
            out_len = 7 + k
            tpl = body_template(sp, out_len)
            if "messages" in sp.extra_body or "note" in sp.extra_body:
                assert tpl is None
            umsg = {"role": "user", "content": user}
            expect = body_of(
                model=sp.model, prompt=None, messages=[*messages, umsg], output_len=out_len,
                ignore_eos=sp.ignore_eos, extra_body=sp.extra_body,
            )  # fmt: skip
            nxt = _next(k + 1, user, out_len, tpl)
            assert h.body(sp, nxt) == expect
            headers = request_headers(TARGET, f"t-s0-t{k + 1}", None)
            assert finish_request(request_head("/v1/chat/completions", headers), expect) == (
                build_request("/v1/chat/completions", headers, expect)
            )
            h.add(umsg, dumps(umsg), tok.count(user))
            amsg = {"role": "assistant", "content": reply}
            h.add(amsg, dumps(amsg), tok.count(reply))
            messages += [umsg, amsg]
            assert h.messages == messages
            assert h.tokens == sum(tok.count(m["content"]) for m in messages)
            assert json.loads(b"[" + h.json + b"]") == messages


def _next(k: int, user: str, out_len: int, tpl: Any) -> Any:
    from app.client.datasets.conversations import Turn
    from app.client.sessions import _NextTurn

    umsg = {"role": "user", "content": user}
    return _NextTurn(k, Turn(user, out_len), umsg, dumps(umsg), 0, "rid", b"", tpl)
