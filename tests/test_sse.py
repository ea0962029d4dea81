"""SSE parsing and event classification, on the real captures byte for byte."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import pytest

from app.client.events import classify
from app.client.sse import SSEEvent, split_events, trailing_event
from app.domain import EventKind

# Real captures from ../shared/fixtures, copied byte for byte (see tests/fixtures/shared).
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "shared" / "sse"
NAMES = [
    "llamacpp-chat.sse",
    "llamacpp-completions.sse",
    "transformers-serve-chat.sse",
    "transformers-serve-completions.sse",
]


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def parse_all(body: bytes, step: int = 64, max_event_bytes: int = 1 << 20) -> list[SSEEvent]:
    """The events of a whole body as the client splits it (``RawStream.finalize_steps``):
    ``step`` events at a time for an LF-only body, whole when it uses CR; then the trailing
    event without its blank line."""
    events, _rest, error = parse_events(body, step, max_event_bytes)
    assert error is None, error
    return events


def parse_events(
    body: bytes, step: int, max_event_bytes: int = 1 << 20
) -> tuple[list[SSEEvent], int, str | None]:
    limit = 0 if b"\r" in body else step
    out: list[SSEEvent] = []
    rest = 0
    while True:
        events, rest, error = split_events(body, max_event_bytes, start=rest, limit=limit)
        out.extend((d, n) for d, n, _end in events)
        if not limit or error is not None or len(events) < limit:
            break
    if error is None:
        ev = trailing_event(body[rest:])
        if ev is not None:
            out.append(ev)
    return out, rest, error


def expected_events(raw: bytes) -> list[bytes]:
    blocks = [b for b in raw.replace(b"\r\n", b"\n").split(b"\n\n") if b.strip()]
    return [b[len(b"data: ") :] for b in blocks]


@pytest.mark.parametrize("name", NAMES)
def test_fixture_whole(name: str) -> None:
    raw = fixture(name)
    events = parse_all(raw)
    assert [d for d, _ in events] == expected_events(raw)
    assert sum(n for _, n in events) == len(raw)  # every byte belongs to one event


@pytest.mark.parametrize("name", NAMES)
def test_fixture_in_pieces_of_every_size(name: str) -> None:
    """Split a few events at a time (resumable pieces) or all at once: the same events."""
    raw = fixture(name)
    want = parse_all(raw, step=0)
    for step in range(1, len(want) + 2):
        assert parse_all(raw, step=step) == want, f"pieces of {step}"


@pytest.mark.parametrize("name", NAMES)
def test_fixture_cut_anywhere(name: str) -> None:
    """A body cut at any byte (the stream ended early) gives the events completed before
    the cut, then the cut-off tail as a trailing event, never bytes counted twice."""
    raw = fixture(name)
    whole = parse_all(raw)
    ends = list(itertools.accumulate(n for _, n in whole))
    for cut in range(len(raw) + 1):
        got = parse_all(raw[:cut])
        complete = sum(1 for e in ends if e <= cut)
        assert got[:complete] == whole[:complete], f"cut at {cut}"
        assert sum(n for _, n in got) <= cut


@pytest.mark.parametrize("name", ["llamacpp-chat.sse", "transformers-serve-chat.sse"])
@pytest.mark.parametrize("eol", [b"\r\n", b"\r"])
def test_fixture_other_line_endings(name: str, eol: bytes) -> None:
    lf = fixture(name)
    raw = lf.replace(b"\n", eol)
    want = [d for d, _ in parse_all(lf)]
    whole = parse_all(raw)
    assert [d for d, _ in whole] == want
    assert sum(n for _, n in whole) == len(raw)


def test_comments_multiline_fields_and_done() -> None:
    stream = (
        b": keep-alive\n\n"
        b'event: message\nid: 7\ndata: {"a":\ndata: 1}\n\n'
        b"data\n\n"
        b"data:no-space\n\n"
        b"retry: 100\n\n"
        b"data: [DONE]\n\n"
    )
    events = parse_all(stream)
    assert [d for d, _ in events] == [None, b'{"a":\n1}', b"", b"no-space", None, b"[DONE]"]
    assert sum(n for _, n in events) == len(stream)
    kinds = [classify(d).kind for d, _ in events]
    assert kinds == [EventKind.OTHER] * 6


def test_partial_event_is_the_rest() -> None:
    events, rest, error = split_events(b'data: {"x":1}\n\ndata: {"y"')
    assert [(d, n) for d, n, _ in events] == [(b'{"x":1}', 15)] and error is None
    assert rest == 15  # where the incomplete event starts


def test_trailing_event_without_blank_line() -> None:
    assert parse_all(b"data: a\n\ndata: b\n") == [(b"a", 9), (b"b", 8)]
    assert trailing_event(b"") is None and trailing_event(b"\n") is None


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"])
def test_oversized_event_is_an_error(eol: bytes) -> None:
    big = b"data: " + b"x" * 110 + eol + eol
    events, _rest, error = parse_events(b"data: a" + eol + eol + big, 64, max_event_bytes=100)
    assert [d for d, _ in events] == [b"a"]  # the events before it are kept
    assert error is not None and "larger than 100 bytes" in error
    open_ended = b"data: " + b"x" * 200  # no separator at all
    assert parse_events(open_ended, 64, max_event_bytes=100)[2] is not None
    assert parse_all(b"data: " + b"x" * 80 + eol + eol, max_event_bytes=100)  # within the cap


# ----------------------------------------------------------------------------- classify


def kinds_of(name: str) -> list[EventKind]:
    return [classify(d).kind for d, _ in parse_all(fixture(name))]


def test_classify_llamacpp_chat() -> None:
    events = parse_all(fixture("llamacpp-chat.sse"))
    cs = [classify(d) for d, _ in events]
    kinds = [c.kind for c in cs]
    assert kinds[0] is EventKind.ROLE  # role chunk with content: null
    assert kinds[-3] is EventKind.ROLE  # empty delta with finish_reason
    assert kinds[-2] is EventKind.USAGE  # choices [] + usage + timings
    assert kinds[-1] is EventKind.OTHER  # [DONE]
    assert Counter(kinds)[EventKind.CONTENT] == 21
    assert cs[-2].usage is not None and cs[-2].usage["completion_tokens"] == 22
    assert "".join(c.text for c in cs).startswith("The primary colors are")
    assert all(c.error is None for c in cs)


def test_classify_llamacpp_completions() -> None:
    cs = [classify(d) for d, _ in parse_all(fixture("llamacpp-completions.sse"))]
    assert Counter(c.kind for c in cs)[EventKind.CONTENT] == 24
    # the last choice chunk has empty text, finish_reason and usage together
    assert cs[-2].kind is EventKind.ROLE and cs[-2].usage is not None
    assert cs[-2].usage["completion_tokens"] == 24


def test_classify_transformers_chat_usage_on_finish_chunk() -> None:
    cs = [classify(d) for d, _ in parse_all(fixture("transformers-serve-chat.sse"))]
    assert cs[0].kind is EventKind.ROLE  # role without content key
    assert cs[-1].kind is EventKind.ROLE and cs[-1].usage == {
        "completion_tokens": 8,
        "prompt_tokens": 37,
        "total_tokens": 45,
    }
    assert "".join(c.text for c in cs) == "The capital of France is Paris."


def test_classify_transformers_completions() -> None:
    cs = [classify(d) for d, _ in parse_all(fixture("transformers-serve-completions.sse"))]
    assert Counter(c.kind for c in cs)[EventKind.CONTENT] == 16
    assert cs[-1].usage is not None and cs[-1].usage["completion_tokens"] == 16


def test_classify_content_with_usage_keeps_usage() -> None:
    c = classify(b'{"choices":[{"delta":{"content":"hi"}}],"usage":{"completion_tokens":3}}')
    assert c.kind is EventKind.CONTENT and c.text == "hi"
    assert c.usage == {"completion_tokens": 3}


@pytest.mark.parametrize(
    ("data", "kind", "text"),
    [
        (b'{"choices":[{"delta":{"reasoning_content":"hm"}}]}', EventKind.REASONING, "hm"),
        (b'{"choices":[{"delta":{"reasoning":"hm","content":""}}]}', EventKind.REASONING, "hm"),
        (b'{"choices":[{"delta":{"content":""}}]}', EventKind.ROLE, ""),
        (b'{"choices":[{"delta":{}, "finish_reason":"stop"}]}', EventKind.ROLE, ""),
        (b'{"choices":[{"text":"x","index":0}]}', EventKind.CONTENT, "x"),
        (b'{"choices":[],"usage":{"completion_tokens":1}}', EventKind.USAGE, ""),
        (b'{"choices":[]}', EventKind.OTHER, ""),
        (b"[DONE]", EventKind.OTHER, ""),
        (None, EventKind.OTHER, ""),
    ],
)
def test_classify_kinds(data: bytes | None, kind: EventKind, text: str) -> None:
    c = classify(data)
    assert (c.kind, c.text, c.error) == (kind, text, None)


def test_classify_errors() -> None:
    c = classify(b"this is not json")
    assert c.error == "non-JSON data line (16 bytes; not shown)"  # named, never quoted
    e = classify(b'{"error":{"message":"model overloaded","code":503}}')
    assert e.error is not None and "model overloaded" in e.error
    s = classify(b'{"error":"boom"}')
    assert s.error is not None and "boom" in s.error
    assert classify(b"[1,2]").error is not None


# ---- the per-stream Classifier (template fast path) must agree with classify exactly

_CHUNK = (
    b'{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"content":%s},"finish_reason":null}]}'
)


def _classify_stream(datas: list[bytes | None]) -> None:
    from app.client.events import Classifier

    c = Classifier()
    for d in datas:
        assert c.classify(d) == classify(d), d


@pytest.mark.parametrize("name", NAMES)
def test_classifier_matches_classify_on_fixtures(name: str) -> None:
    from app.client.events import Classifier

    datas = [d for d, _ in parse_all(fixture(name))]
    _classify_stream(datas)
    _classify_stream(datas * 3)
    c = Classifier()
    for d in datas:
        c.classify(d)
    assert c._templates  # the fast path is in use on every real server's chunks


def test_classifier_matches_classify_on_tricky_chunks() -> None:
    lits = [
        b'"hello"',
        b'" the"',
        b'"\\u00e9t\\u00e9"',
        '"été"'.encode(),
        b'"a\\"b"',
        b'"\\n"',
        b'""',  # empty text: not a content event
        b'"a", "content": "b"',  # two values in the slot
        b'"a"} , "x": {"y": 1',
        b'"unterminated',
        b'"bad \\x escape"',
        b'"ctl \x01 char"',
        b'"\xff invalid utf-8"',
        b'"\xed\xa0\x80 surrogate"',
        b"null",
        b"1",
        b'"ok"',
    ]
    datas: list[bytes | None] = [_CHUNK % b'"seed"']
    for lit in lits:
        datas.append(_CHUNK % lit)
        datas.append(_CHUNK % b'"again"')
    datas += [
        _CHUNK % b'"x"' + b" ",  # trailing whitespace
        b" " + _CHUNK % b'"x"',
        _CHUNK % b'"x"' + b"garbage",
        _CHUNK.replace(b'"delta"', b'"error":"boom","delta"') % b'"x"',
        b'{"error":{"message":"overloaded","code":503}}',
        b"not json",
        b"[DONE]",
        None,
        b"",
        # the text value duplicated elsewhere: no template from it
        _CHUNK.replace(b'"m"', b'"dup"') % b'"dup"',
        _CHUNK.replace(b'"m"', b'"dup"') % b'"other"',
        # duplicate "content" keys: the last one wins
        _CHUNK % b'"first","content":"second"',
        _CHUNK % b'"first","content":"third"',
        # reasoning then content in the same template layout
        _CHUNK.replace(b'"content"', b'"reasoning_content"') % b'"think"',
        _CHUNK.replace(b'"content"', b'"reasoning_content"') % b'"more"',
        _CHUNK.replace(b'"content"', b'"reasoning_content"') % b'""',
        # completions layout and a usage chunk with the same prefix
        b'{"choices":[{"text":"a","index":0}],"model":"m"}',
        b'{"choices":[{"text":"b","index":0}],"model":"m"}',
        b'{"choices":[{"text":"b","index":0}],"model":"m","usage":{"completion_tokens":2}}',
    ]
    _classify_stream(datas)
    _classify_stream(list(reversed(datas)))


def test_split_events_in_pieces_matches_whole() -> None:
    from app.client.sse import split_events

    for name in NAMES:
        raw = fixture(name)
        lf = raw.replace(b"\r\n", b"\n")
        for buf in (raw, lf, lf.replace(b"\n\n", b"\n\n\n"), lf + b"data: tail", raw + b"\r"):
            want = split_events(buf)
            for limit in (1, 2, 3, 7):
                got: list[tuple[bytes | None, int, int]] = []
                rest = 0
                cr = b"\r" in buf  # a resuming call says what the first one found
                while True:
                    evs, rest, err = split_events(buf, start=rest, limit=limit, cr=cr)
                    assert len(evs) <= limit  # CR streams too: never all events in one list
                    got += evs
                    if err is not None or len(evs) < limit:
                        break
                assert (got, rest, err) == want
