"""A stream decoded while it arrives (``RawStream.advance``, a session's or agent's reply)
ends decoded exactly as the same bytes decoded at the end: the same events, stamps, sizes,
status and error, whatever the reads' cuts, the chunking, the line endings or the fault."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import pytest

from app.client.events import Classifier, classify
from app.client.limits import CUT_EVENTS_KEPT
from app.client.raw_stream import (
    END_BODY,
    END_CAP,
    END_EOF,
    END_NONE,
    MODE_CHUNKED,
    RawStream,
)
from app.domain import RequestStatus

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "shared" / "sse"
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def chunked(payload: bytes, sizes: list[int], ext: bool = False) -> bytes:
    """``payload`` framed in chunks of ``sizes`` (cycled), then the terminal chunk."""
    out = bytearray()
    pos = 0
    i = 0
    while pos < len(payload):
        n = min(sizes[i % len(sizes)], len(payload) - pos)
        out += f"{n:x}{';x=1' if ext and i % 3 == 0 else ''}\r\n".encode()
        out += payload[pos : pos + n] + b"\r\n"
        pos += n
        i += 1
    return bytes(out + b"0\r\n\r\n")


def feed(
    raw_body: bytes,
    cuts: list[int],
    *,
    eager: bool,
    end_kind: int = END_BODY,
    status: RequestStatus = RequestStatus.OK,
    **limits: int,
) -> tuple[RawStream, int]:
    """The response's bytes in reads ending at ``cuts``, as the read callback captures them
    (``advance`` after each read when ``eager``), then finalized. Returns the stream and how
    many events were decoded before its end."""
    r = RawStream("t", **limits)  # type: ignore[arg-type]
    r.mode, r.http_status, r.content_type = MODE_CHUNKED, 200, "text/event-stream"
    r.body_start = len(HEAD)
    if eager:
        r.decode_while_arriving(Classifier().classify)
    data = HEAD + raw_body
    ends = sorted({c + len(HEAD) for c in cuts if 0 < c < len(raw_body)} | {len(data)})
    prev = 0
    for i, end in enumerate(ends):
        r.buf += data[prev:end]
        r.read_t.append(1_000 + i)
        r.read_user_t.append(5_000 + i)
        r.read_end.append(end)
        prev = end
        if eager and i < len(ends) - 1:
            r.advance()
    ahead = len(r.ev_t)
    r.status, r.end_kind, r.end_stamp = status, end_kind, 1_000 + len(ends) - 1
    if status is not RequestStatus.OK:
        r.error = "timed out"
    r.finalize()
    return r, ahead


def same(a: RawStream, b: RawStream) -> None:
    for name in ("ev_t", "ev_user_t", "ev_bytes", "ev_data", "status", "error", "done_ns"):
        assert getattr(a, name) == getattr(b, name), name
    assert a.body_bytes == b.body_bytes


def check(raw_body: bytes, cuts: list[int], **kw: Any) -> int:
    """Decoded ahead == decoded at the end; the events classified ahead are ``classify``'s.
    Returns how many events were decoded ahead."""
    eager, ahead = feed(raw_body, cuts, eager=True, **kw)
    whole, none = feed(raw_body, cuts, eager=False, **kw)
    assert none == 0
    same(eager, whole)
    done = eager.ev_classified or []
    assert done == [classify(d) for d in eager.ev_data[: len(done)]]
    return ahead


def random_cuts(rng: random.Random, n: int, reads: int) -> list[int]:
    return sorted(rng.sample(range(1, n), min(reads, n - 1)))


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.sse")))
def test_real_captures_cut_and_chunked_anyhow(name: str) -> None:
    payload = (FIXTURES / name).read_bytes()
    rng = random.Random(name)
    for trial in range(60):
        sizes = [rng.randint(1, 400) for _ in range(5)]
        body = chunked(payload, sizes, ext=trial % 4 == 0)
        cuts = random_cuts(rng, len(body), rng.randint(1, 80))
        check(body, cuts)


def test_each_event_in_its_own_chunk_and_read_is_decoded_before_the_end() -> None:
    """The usual stream: a chunk per event, a read per chunk: everything but the last read's
    events was decoded before the end."""
    events = [b'data: {"choices":[{"delta":{"content":"w%d"}}]}\n\n' % i for i in range(30)]
    body = b"".join(f"{len(e):x}\r\n".encode() + e + b"\r\n" for e in events)
    body += b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
    cuts = list(itertools.accumulate(len(f"{len(e):x}\r\n") + len(e) + 2 for e in events))
    assert check(body, cuts) == 30


@pytest.mark.parametrize("eol", [b"\r\n", b"\r"])
def test_cr_line_endings_early_or_only_in_the_tail(eol: bytes) -> None:
    ev = [b'data: {"choices":[{"text":"t%d"}]}' % i for i in range(20)]
    crlf_all = b"".join(e + eol + eol for e in ev)
    lf_then_cr = b"".join(e + b"\n\n" for e in ev[:15]) + b"".join(e + eol + eol for e in ev[15:])
    rng = random.Random(1)
    for payload in (crlf_all, lf_then_cr, b"\n" + lf_then_cr):
        for _ in range(20):
            body = chunked(payload, [rng.randint(5, 90)])
            check(body, random_cuts(rng, len(body), 25))


def test_framing_faults_anywhere() -> None:
    payload = b"".join(b'data: {"choices":[{"text":"x%d"}]}\n\n' % i for i in range(12))
    good = chunked(payload, [40])
    faults = [
        good[:200] + b"zz\r\n" + good[200:],  # a bad size line (if 200 is a line start)
        good[:150] + b"-5\r\nabc\r\n" + good[150:],
        good[:120] + b"9" * 2000,  # a size line that never ends
    ]
    first = good.index(b"\r\n") + 2 + 40  # the first chunk's data end: its CRLF replaced
    faults.append(good[:first] + b"XX" + good[first + 2 :])
    rng = random.Random(2)
    for body in faults:
        for _ in range(15):
            check(body, random_cuts(rng, len(body), 20))
        whole, _ = feed(body, [], eager=False)
        assert whole.status is RequestStatus.ERROR and "chunked body" in (whole.error or "")


def test_done_mid_stream_comments_multiline_and_a_trailing_event() -> None:
    payload = (
        b": keep-alive\n\n"
        + b'data: {"choices":[{"text":"a"}]}\n\n'
        + b'event: x\ndata: {"choices":\ndata: [{"text":"b"}]}\n\n'
        + b"data: [DONE]\n\n"
        + b'data: {"choices":[{"text":"after"}]}\n\n'
    )
    rng = random.Random(3)
    for _ in range(30):
        body = chunked(payload, [rng.randint(1, 50)])
        check(body, random_cuts(rng, len(body), 15))
    tail = b'data: {"choices":[{"text":"a"}]}\n\ndata: {"choices":[{"text":"z"}]}'
    for _ in range(10):
        body = chunked(tail, [rng.randint(1, 30)])
        check(body, random_cuts(rng, len(body), 8))


def test_limits_an_event_too_large_and_too_many_events() -> None:
    small = b'data: {"choices":[{"text":"s"}]}\n\n'
    big = b"data: " + b"x" * 300 + b"\n\n"
    payload = small * 5 + big + small * 5
    rng = random.Random(4)
    for _ in range(20):
        body = chunked(payload, [rng.randint(10, 120)])
        check(body, random_cuts(rng, len(body), 20), max_event_bytes=200)
        check(body, random_cuts(rng, len(body), 20), max_events=4)
    many = chunked(small * (CUT_EVENTS_KEPT + 50), [4096])
    for end_kind in (END_CAP, END_BODY):
        ahead = check(many, list(range(500, len(many), 997)), end_kind=end_kind)
        assert ahead <= CUT_EVENTS_KEPT


def test_cut_off_streams() -> None:
    payload = b"".join(b'data: {"choices":[{"text":"c%d"}]}\n\n' % i for i in range(10))
    body = chunked(payload, [33])
    rng = random.Random(5)
    for _ in range(20):
        cut = body[: rng.randint(1, len(body) - 6)]
        cuts = random_cuts(rng, len(cut), 6) if len(cut) > 2 else []
        check(cut, cuts, end_kind=END_EOF)
        check(cut, cuts, end_kind=END_NONE, status=RequestStatus.TIMEOUT)


def _spy(monkeypatch: pytest.MonkeyPatch, module: Any) -> list[tuple[int, bool, int, int]]:
    """``module.reply_text`` watched: at each reply's end, how many of its events were
    decoded already, whether it was finalized, and its events and reads once decoded."""
    seen: list[tuple[int, bool, int, int]] = []
    real = module.reply_text

    def spy(raw: RawStream, classify: Any) -> str | None:
        ahead, finalized, reads = len(raw.ev_t), raw.finalized, len(raw.read_end)
        out: str | None = real(raw, classify)
        seen.append((ahead, finalized, len(raw.ev_t), reads))
        assert raw.ev_classified == [classify(d) for d in raw.ev_data]
        return out

    monkeypatch.setattr(module, "reply_text", spy)
    return seen


def test_agent_and_session_replies_are_decoded_as_they_arrive(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Over real loopback sockets: when an agent trace's reply (and a multi-turn session's)
    ends, all but its last read's events (the last token, usage, ``[DONE]``) were decoded
    and classified already; the runs' children carry the same replies as before."""
    from app.client import agent_sessions, sessions
    from app.client.runner import run_load
    from tests.test_agent_traces import AGENT, reply
    from tests.test_agent_traces import spec as agent_spec
    from tests.test_client import Server, run
    from tests.test_sessions import conversations, replier
    from tests.test_sessions import spec as session_spec

    for module, make in (
        (agent_sessions, lambda url: agent_spec(url, AGENT)),
        (sessions, lambda url: session_spec(url, conversations(tmp_path, [["a", "b", "c"]]))),
    ):
        seen = _spy(monkeypatch, module)

        async def go(make: Any = make) -> Any:
            async with Server(replier(gap_s=0.003)) as srv:
                res = await run_load(make(srv.url), run_tag="e")
            return res, {r.headers["x-request-id"]: r.body for r in srv.requests}

        res, bodies = run(go())
        assert all(r.status is RequestStatus.OK for r in res.records), res.records
        assert len(seen) >= 3
        for ahead, finalized, total, _reads in seen:
            assert not finalized and total >= 4
            assert ahead >= total - 3 and ahead > 0, seen
        if module is sessions:
            assert bodies["e-s0-t2"]["messages"][1]["content"] == reply("e-s0-t1", 3)
        else:
            assert bodies["e-s0-t2"]["messages"][2]["content"] == reply("e-s0-t1", 4)
