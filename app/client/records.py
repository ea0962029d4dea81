"""Turn a finished ``RawStream`` into a ``RequestRecord``: classify events, count tokens.

Token counting (SPEC 1: network chunks are not tokens):

* the tokenizer count: ``ChunkTokens`` over the texts of the token-bearing events (content
  and reasoning), as ``tokens_per_chunk`` tokenizing the whole text once, a window at a time
  for a very long text (memory: one int per event, not a list per token);
* the server count: ``usage.completion_tokens`` when the stream carried a usage object.

With ``token_counting`` "auto" or "usage" and a usage count present: if it equals the number
of token-bearing chunks, the server streamed one token per chunk and each chunk gets exactly
1 token; otherwise the chunks keep their tokenizer counts (nothing is scaled) and
``output_tokens`` is the usage count. ``token_source`` says which count ``output_tokens`` is;
both counts are always recorded so reports can flag disagreement.

Prompt tokens follow the same rule: with "auto" or "usage" and ``usage.prompt_tokens``
present, ``input_tokens`` is the server's count (a chat template adds tokens the client's
tokenizer never saw); ``tokenizer_input_tokens`` keeps the client's.

``cached_prompt_tokens``: the prompt tokens the server says it served from its prefix cache
(``app.client.events.cached_prompt_tokens``; None where it did not say).

The run's surface (``app.client.endpoints``) classifies the events (``classify``). A surface
that generates no tokens (embeddings, rerank) gives a ``ResultRule``: its answer event must
carry the results it names, counts its items (the event's tokens column: inputs embedded,
documents scored) and the record has no output tokens. An answer of another surface's shape
fails its request naming what was expected (``answer``) and what came.
"""

from __future__ import annotations

from array import array
from collections.abc import Generator
from typing import Any

import numpy as np

from app.client.chunk_tokens import ChunkTokens
from app.client.endpoints.base import ClassifyFn, ResultRule, wrong_shape
from app.client.events import Classifier, cached_prompt_tokens
from app.client.raw_stream import RawStream
from app.client.spec import TokenCounting
from app.client.tokenizer import BuiltinTokenizer, HFTokenizer
from app.domain import TOKEN_KINDS, EventKind, RequestRecord, RequestStatus

RECORD_STEP_EVENTS = 16  # events classified per resumable piece of record_steps


def _int_or_none(usage: dict[str, Any] | None, key: str) -> int | None:
    if usage is None:
        return None
    v = usage.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _span(start_ns: int, end_ns: int) -> int | None:
    """``end - start`` of a phase (0 where the two clocks' stamps cross); None when either
    end did not happen."""
    if not start_ns or not end_ns:
        return None
    return max(0, end_ns - start_ns)


def record_steps(
    raw: RawStream,
    *,
    index: int,
    scheduled_ns: int,
    run_start_ns: int,
    tokenizer: BuiltinTokenizer | HFTokenizer,
    token_counting: TokenCounting,
    warmup: bool = False,
    input_tokens: int | None = None,
    classify: ClassifyFn | None = None,
    rule: ResultRule | None = None,
    answer: str | None = None,
) -> Generator[None, None, RequestRecord]:
    """Build the record in resumable pieces: yields between pieces (finalizing the stream,
    every ``RECORD_STEP_EVENTS`` events classified, token counting) and returns the record."""
    yield from raw.finalize_steps()  # nothing to do when already decoded
    n = len(raw.ev_t)
    if n > RECORD_STEP_EVENTS:  # a short stream (an answer) is recorded in one piece
        yield
    kind_list = bytearray()  # one EventKind per event
    chunk_tokens = ChunkTokens(tokenizer)  # the token events' texts, counted as they come
    add_text = chunk_tokens.add
    token_idx = array("q")
    usage: dict[str, Any] | None = None
    usage_data: bytes | None = None  # the event that carried ``usage``
    stream_error: str | None = None
    shaped = False  # an event of the surface's own shape came (any but OTHER)
    answer_i = -1  # a non-generative surface's answer event, and its results
    answer_items = 0
    if classify is None:
        classify = Classifier().classify
    done = raw.ev_classified or []  # the first events, classified as they arrived
    if len(done) > n:
        done = []
    for i, data in enumerate(raw.ev_data):
        if i % RECORD_STEP_EVENTS == RECORD_STEP_EVENTS - 1:
            yield
        kind, text, ev_usage, ev_error, items = done[i] if i < len(done) else classify(data)
        kind_list.append(kind)
        shaped = shaped or kind is not EventKind.OTHER
        if rule is not None and kind is EventKind.ANSWER and answer_i < 0:
            answer_i, answer_items = i, items
        if ev_usage is not None:
            usage, usage_data = ev_usage, data
        if ev_error is not None and stream_error is None:
            stream_error = ev_error
        if kind in TOKEN_KINDS:
            add_text(text)
            token_idx.append(i)
    kinds = np.frombuffer(kind_list, np.int8) if kind_list else np.zeros(0, np.int8)

    if n > RECORD_STEP_EVENTS:
        yield
    counts = chunk_tokens.finish()
    tok_total = sum(counts)
    usage_ct = _int_or_none(usage, "completion_tokens")
    ev_tokens = np.zeros(n, np.int32)
    source: str | None
    output_tokens: int
    if token_counting != "tokenizer" and usage_ct is not None:
        source = "usage"
        output_tokens = usage_ct
        if usage_ct == len(token_idx):
            counts = array("i", [1]) * len(token_idx)
    else:
        source = "tokenizer"
        output_tokens = tok_total
    if token_idx:
        ev_tokens[np.frombuffer(token_idx, np.int64)] = np.frombuffer(counts, np.intc)

    status = raw.status
    error = raw.error
    out_tokens: int | None = output_tokens
    tok_out: int | None = tok_total
    if rule is not None:  # one answer, no tokens generated: it counts its items
        out_tokens = tok_out = usage_ct = None
        source = None
        if answer_i >= 0:
            ev_tokens[answer_i] = rule.items
    if status is RequestStatus.OK:
        first = next((d for d in raw.ev_data if d is not None and d != b"[DONE]"), None)
        if stream_error is not None:
            status, error = RequestStatus.ERROR, stream_error
        elif rule is not None and answer_i < 0:
            status, error = RequestStatus.ERROR, wrong_shape(answer or "an answer", first)
        elif rule is not None and answer_items != rule.results:
            status = RequestStatus.ERROR
            error = f"the answer carries {answer_items:,} results; {rule.results:,} were asked for"
        elif rule is None and not token_idx and not shaped and first is not None and answer:
            status, error = RequestStatus.ERROR, wrong_shape(answer, first)
        elif rule is None and not token_idx:
            status, error = RequestStatus.ERROR, "stream ended without any generated token"

    def rel(t: int | None) -> int | None:
        return None if t is None else t - run_start_ns

    t0 = raw.t0_ns if raw.t0_ns else None
    t1 = raw.ev_t[token_idx[0]] if token_idx else 0
    usage_pt = _int_or_none(usage, "prompt_tokens")
    prompt_tokens = input_tokens
    if token_counting != "tokenizer" and usage_pt is not None:
        prompt_tokens = usage_pt
    return RequestRecord(
        index=index,
        scheduled_ns=scheduled_ns,
        sent_ns=rel(t0),
        end_ns=rel(raw.end_ns) if raw.end_ns else None,
        status=status,
        error=error,
        http_status=raw.http_status,
        input_tokens=prompt_tokens,
        output_tokens=out_tokens,
        tokenizer_output_tokens=tok_out,
        usage_prompt_tokens=usage_pt,
        usage_completion_tokens=usage_ct,
        cached_prompt_tokens=cached_prompt_tokens(usage, usage_data),
        token_source=source,  # type: ignore[arg-type]
        done_ns=rel(raw.done_ns),
        warmup=warmup,
        connect_ns=_span(raw.connect_start_ns, raw.connect_end_ns),
        tls_ns=_span(raw.connect_end_ns, raw.tls_end_ns),
        sending_ns=_span(raw.t0_ns, raw.sent_end_ns) if raw.sent_any else None,
        waiting_ns=_span(raw.sent_end_ns, raw.head_ns) if raw.sent_any else None,
        first_token_ns=_span(raw.head_ns, t1),
        conn_id=raw.conn_id or None,
        conn_reused=raw.conn_reused if raw.conn_id else None,
        retries=raw.retries,
        tokenizer_input_tokens=input_tokens,
        event_t_ns=np.asarray(raw.ev_t, np.int64) - np.int64(run_start_ns),
        event_bytes=np.asarray(raw.ev_bytes, np.int32),
        event_kind=kinds,
        event_tokens=ev_tokens,
    )
