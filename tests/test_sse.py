"""SSE parsing and event classification, on the real captures byte for byte."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from app.client.events import classify
from app.client.sse import SSEEvent, SSEEventTooLarge, SSEParser
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


def parse_all(parts: list[bytes]) -> list[SSEEvent]:
    p = SSEParser()
    out: list[SSEEvent] = []
    for part in parts:
        out.extend(p.feed(part))
    out.extend(p.flush())
    return out


def expected_events(raw: bytes) -> list[bytes]:
    blocks = [b for b in raw.replace(b"\r\n", b"\n").split(b"\n\n") if b.strip()]
    return [b[len(b"data: ") :] for b in blocks]


@pytest.mark.parametrize("name", NAMES)
def test_fixture_whole(name: str) -> None:
    raw = fixture(name)
    events = parse_all([raw])
    assert [d for d, _ in events] == expected_events(raw)
    assert sum(n for _, n in events) == len(raw)  # every byte belongs to one event


@pytest.mark.parametrize("name", NAMES)
def test_fixture_split_at_every_byte(name: str) -> None:
    raw = fixture(name)
    want = parse_all([raw])
    for i in range(len(raw) + 1):
        assert parse_all([raw[:i], raw[i:]]) == want, f"split at byte {i}"


@pytest.mark.parametrize("name", NAMES)
def test_fixture_one_byte_at_a_time(name: str) -> None:
    raw = fixture(name)
    assert parse_all([raw[i : i + 1] for i in range(len(raw))]) == parse_all([raw])


@pytest.mark.parametrize("name", ["llamacpp-chat.sse", "transformers-serve-chat.sse"])
@pytest.mark.parametrize("eol", [b"\r\n", b"\r"])
def test_fixture_other_line_endings_split_everywhere(name: str, eol: bytes) -> None:
    lf = fixture(name)
    raw = lf.replace(b"\n", eol)
    want = [d for d, _ in parse_all([lf])]
    whole = parse_all([raw])
    assert [d for d, _ in whole] == want
    assert sum(n for _, n in whole) == len(raw)
    step = 1 if name.startswith("transformers") else 7
    for i in range(0, len(raw) + 1, step):
        assert parse_all([raw[:i], raw[i:]]) == whole, f"split at byte {i}"


def test_comments_multiline_fields_and_done() -> None:
    stream = (
        b": keep-alive\n\n"
        b'event: message\nid: 7\ndata: {"a":\ndata: 1}\n\n'
        b"data\n\n"
        b"data:no-space\n\n"
        b"retry: 100\n\n"
        b"data: [DONE]\n\n"
    )
    events = parse_all([stream])
    assert [d for d, _ in events] == [None, b'{"a":\n1}', b"", b"no-space", None, b"[DONE]"]
    assert sum(n for _, n in events) == len(stream)
    kinds = [classify(d).kind for d, _ in events]
    assert kinds == [EventKind.OTHER] * 6


def test_partial_event_stays_pending() -> None:
    p = SSEParser()
    assert p.feed(b'data: {"x"') == []
    assert p.pending == b'data: {"x"'
    assert p.feed(b":1}\n") == []
    assert p.feed(b"\n") == [(b'{"x":1}', 15)]
    assert p.pending == b""


def test_trailing_event_without_blank_line_is_flushed() -> None:
    p = SSEParser()
    assert p.feed(b"data: a\n\ndata: b\n") == [(b"a", 9)]
    assert p.flush() == [(b"b", 8)]
    assert p.flush() == []


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"])
def test_oversized_event_raises(eol: bytes) -> None:
    p = SSEParser(max_event_bytes=100)
    p.feed(b"data: " + b"x" * 50)
    with pytest.raises(SSEEventTooLarge):
        p.feed(b"x" * 60 + eol)
    ok = SSEParser(max_event_bytes=100)
    assert ok.feed(b"data: " + b"x" * 80 + eol + eol)  # a complete event within the cap


# ----------------------------------------------------------------------------- classify


def kinds_of(name: str) -> list[EventKind]:
    return [classify(d).kind for d, _ in parse_all([fixture(name)])]


def test_classify_llamacpp_chat() -> None:
    events = parse_all([fixture("llamacpp-chat.sse")])
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
    cs = [classify(d) for d, _ in parse_all([fixture("llamacpp-completions.sse")])]
    assert Counter(c.kind for c in cs)[EventKind.CONTENT] == 24
    # the last choice chunk has empty text, finish_reason and usage together
    assert cs[-2].kind is EventKind.ROLE and cs[-2].usage is not None
    assert cs[-2].usage["completion_tokens"] == 24


def test_classify_transformers_chat_usage_on_finish_chunk() -> None:
    cs = [classify(d) for d, _ in parse_all([fixture("transformers-serve-chat.sse")])]
    assert cs[0].kind is EventKind.ROLE  # role without content key
    assert cs[-1].kind is EventKind.ROLE and cs[-1].usage == {
        "completion_tokens": 8,
        "prompt_tokens": 37,
        "total_tokens": 45,
    }
    assert "".join(c.text for c in cs) == "The capital of France is Paris."


def test_classify_transformers_completions() -> None:
    cs = [classify(d) for d, _ in parse_all([fixture("transformers-serve-completions.sse")])]
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
    assert c.error is not None and "non-JSON data line" in c.error and "not json" in c.error
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

    datas = [d for d, _ in parse_all([fixture(name)])]
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
                while True:
                    evs, rest, err = split_events(buf, start=rest, limit=limit)
                    got += evs
                    if err is not None or len(evs) < limit or b"\r" in buf:
                        break
                assert (got, rest, err) == want
