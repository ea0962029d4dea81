"""The client's cost per operation on the paths issue 16 is about (CPU time of this thread,
best of several repetitions, so the figures stay meaningful on a busy machine):

    python benchmarks/bench_client_ops.py [--output-len 32]
        [--out benchmarks/results/client_ops.json]

* next turn (multi-turn sessions): what runs between a reply's last read and the next
  turn's send. Since issue 25 there is one decoder and it runs after the stream: where the
  reply ended, ``reply_text`` decodes the capture (``RawStream.finalize``) and classifies
  its events (the record then reuses that classification), the reply's JSON is appended to
  the serialised history and the prepared request head finished (``at_reply_end``).
  ``whole_stream_decode`` is the way before issue 16: the same decode plus the whole body
  serialised again, headers and request bytes rebuilt. The history is 3 earlier turns of
  64 words and their replies.
* per read: the read callback's bookkeeping (``StreamRequest._took``) for one read of one
  event (no decoding during the stream).
* record: post-processing one finished stream into its record (off the critical path),
  classifying every event, or reusing the classification ``reply_text`` did.
* stream object: creating one request's ``StreamRequest`` (a next turn's, after its bytes;
  starting it, the connection check and the send syscall are not in these figures).
* dispatch: building one trace request (a 1,536-token Mooncake prompt: body, headers,
  request bytes), done before the request is due.

The stream is a real simulator response (chat, one token per event, role and usage
chunks), replayed read by read into the client's capture.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.client.clocks import ClockMap
from app.client.datasets.base import Prompt
from app.client.datasets.conversations import Turn
from app.client.endpoints import endpoint_type
from app.client.endpoints.base import BodyParams, NoOptions
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
from app.client.sessions import History, _NextTurn, body_template, dumps, reply_text
from app.client.spec import RunSpec
from app.client.tokenizer import BuiltinTokenizer
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_process

TARGET = parse_target("http://127.0.0.1:8000/v1")
PATH = "/v1/chat/completions"
CHAT = endpoint_type("chat")
COMPLETIONS = endpoint_type("completions")


def chat_body(messages: list[dict[str, Any]], output_len: int, model: str = "sim") -> bytes:
    params = BodyParams(model, True, True, {})
    return CHAT.body(Prompt(None, messages, 0, output_len), params, NoOptions())


CLOCK = ClockMap()
WORDS = " ".join(f"w{i}" for i in range(64))
TURNS = [f"turn {k}: {WORDS}" for k in range(4)]


def simulator_response(output_len: int) -> bytes:
    """One chat response of ``output_len`` tokens, as the simulator streams it."""
    with start_simulator_process(SimConfig(ttft_ms=1, itl_ms=0.05, seed=1)) as sim:
        t = parse_target(sim.base_url)
        msgs = [{"role": "user", "content": TURNS[0]}]
        body = chat_body(msgs, output_len)
        req = build_request(t.url_path(PATH), request_headers(t, "ops-s0-t1", None), body)
        with socket.create_connection((t.host, t.port)) as s:
            s.sendall(req)
            data = b""
            while not data.endswith(b"\r\n0\r\n\r\n"):
                got = s.recv(65536)
                if not got:
                    break
                data += got
    return data


def reads_of(data: bytes) -> list[bytes]:
    """The response cut into reads: the head with the first chunk, then a chunk a read."""
    pieces: list[bytes] = []
    pos = data.index(b"\r\n\r\n") + 4
    start = 0
    while pos < len(data):
        j = data.index(b"\r\n", pos)
        size = int(data[pos:j], 16)
        end = j + 2 + size + 2 if size else len(data)
        pieces.append(data[start:end])
        start = pos = end
    return pieces


LOOP = asyncio.new_event_loop()  # "[DONE]" before the body's end arms a timer (never run)


def new_stream() -> StreamRequest:
    sr = StreamRequest(
        TARGET, ("127.0.0.1", 8000), socket.AF_INET, PATH, b"", [], request_id="x",
        timeout_s=5, clock=CLOCK, request_bytes=b"x",
    )  # fmt: skip
    sr._loop = LOOP
    return sr


def feed(sr: StreamRequest, pieces: list[bytes]) -> RawStream:
    r = sr.raw
    for p in pieces:
        old = len(r.buf)
        r.buf += p
        t = time.monotonic_ns()
        sr._took(old, len(p), t, t)
    return r


def cpu_us(
    fn: Callable[..., object], setup: Callable[[], object] | None = None, n: int = 400
) -> float:
    """Best of 7 of the mean thread CPU time of ``fn`` (µs); ``setup`` runs untimed before
    each call and its result is passed on."""
    best = float("inf")
    for _ in range(7):
        args = [setup() for _ in range(n)] if setup is not None else None
        gc.collect()
        gc.disable()
        t0 = time.thread_time_ns()
        if args is None:
            for _ in range(n):
                fn()
        else:
            for a in args:
                fn(a)
        dt = time.thread_time_ns() - t0
        gc.enable()
        best = min(best, dt / n / 1e3)
    return round(best, 2)


def session_history(
    spec: RunSpec, tok: BuiltinTokenizer, reply: str
) -> tuple[History, list[dict[str, Any]]]:
    h = History((), tok)
    for k in range(3):
        u = {"role": "user", "content": TURNS[k]}
        a = {"role": "assistant", "content": reply}
        h.add(u, dumps(u), tok.count(TURNS[k]))
        h.add(a, dumps(a), tok.count(reply))
    return h, list(h.messages)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "client_ops.json"))
    args = ap.parse_args()
    data = simulator_response(args.output_len)
    pieces = reads_of(data)
    tok = BuiltinTokenizer()
    spec = RunSpec(
        base_url="http://127.0.0.1:8000/v1", model="sim", dataset="jsonl",
        dataset_path="/dev/null", multi_turn=True, output_len=args.output_len,
        scrape_metrics=False,
    )  # fmt: skip
    reply = reply_text(feed(new_stream(), pieces), Classifier().classify)
    assert isinstance(reply, str)
    history, messages = session_history(spec, tok, reply)
    user = {"role": "user", "content": TURNS[3]}

    def whole_stream_decode(raw: RawStream) -> bytes:
        text = reply_text(raw, Classifier().classify)
        assert text is not None
        msgs = [*messages, {"role": "assistant", "content": text}, user]
        body = chat_body(msgs, args.output_len, spec.model)
        tok.count(text)
        headers = request_headers(TARGET, "ops-s0-t4", None, keep_alive=True)
        return build_request(PATH, headers, body)

    nxt = _NextTurn(
        4, Turn(TURNS[3], args.output_len), user, dumps(user), tok.count(TURNS[3]),
        "ops-s0-t4", request_head(PATH, request_headers(TARGET, "ops-s0-t4", None)),
        body_template(spec, args.output_len),
    )  # fmt: skip

    def reply_ended() -> tuple[RawStream, History]:
        raw = feed(new_stream(), pieces)  # every read captured, nothing decoded
        h = History((), tok)
        h.messages, h.json, h.tokens = list(history.messages), history.json, history.tokens
        return raw, h

    def at_reply_end(state: tuple[RawStream, History]) -> bytes:
        raw, h = state
        text = reply_text(raw, Classifier().classify)  # the one decoder, then classify
        assert isinstance(text, str)
        m = {"role": "assistant", "content": text}
        h.add(m, dumps(m), tok.count(text))
        return finish_request(nxt.head, h.body(spec, nxt))

    def finished_stream() -> RawStream:
        return feed(new_stream(), pieces)

    mid = pieces[len(pieces) // 2 : len(pieces) // 2 + 1]

    def read_setup() -> StreamRequest:
        sr = new_stream()
        feed(sr, pieces[: len(pieces) // 2])
        return sr

    def one_read(sr: StreamRequest) -> None:
        feed(sr, mid)

    def replied() -> RawStream:
        raw = feed(new_stream(), pieces)
        reply_text(raw, Classifier().classify)  # hands its classification to the record
        return raw

    def build_record(raw: RawStream) -> object:
        steps = record_steps(
            raw, index=0, scheduled_ns=0, run_start_ns=0, tokenizer=tok, token_counting="auto"
        )
        try:
            while True:
                next(steps)
        except StopIteration as stop:
            return stop.value

    old_req = whole_stream_decode(finished_stream())
    assert at_reply_end(reply_ended()) == old_req  # the same bytes either way

    trace_prompt = " ".join(f"w{i % 997}" for i in range(1536))

    def dispatch_build() -> bytes:
        params = BodyParams("sim", False, True, {})
        body = COMPLETIONS.body(Prompt(trace_prompt, None, 0, 16), params, NoOptions())
        headers = request_headers(TARGET, "wl-123", None, keep_alive=True)
        return build_request("/v1/completions", headers, body)

    out: dict[str, Any] = {
        "host": platform.node(),
        "python": platform.python_version(),
        "unit": "us of thread CPU per operation (best of 7)",
        "stream": {"output_tokens": args.output_len, "reads": len(pieces), "bytes": len(data)},
        "next_turn_us": {
            "whole_stream_decode": cpu_us(whole_stream_decode, finished_stream),
            "at_reply_end": cpu_us(at_reply_end, reply_ended),
        },
        "per_read_us": {"capture_only": cpu_us(one_read, read_setup, n=2000)},
        "dispatch_build_us": cpu_us(dispatch_build, n=2000),
        "stream_object_us": cpu_us(new_stream, n=2000),  # a request's StreamRequest
        "record_us": {  # post-processing one finished stream into its record
            "classifying_every_event": cpu_us(build_record, finished_stream),
            "events_classified_at_reply_end": cpu_us(build_record, replied),
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
