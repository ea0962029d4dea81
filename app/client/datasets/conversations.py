"""Whole conversations for multi-turn sessions (``RunSpec.multi_turn``): each one's human
turns in order, with the output length asked for each reply.

* ``sharegpt``: a ShareGPT JSON array (``dataset_path``, or the packaged file). A turn is a
  ``human`` entry; its output length is the token count of the ``gpt`` reply right after it
  (``dataset_options.output_len`` overrides it; a human turn with no reply after it gets the
  run's ``output_len``). The file's entries are shuffled with ``random.Random(seed)``.
  vLLM's length filters (``dataset_options`` ``min_len``, ``max_prompt_len``,
  ``max_total_len``) apply to each turn's own text and reply: a session is cut before its
  first failing turn, and dropped when that is its first (or it has no human turn).
  ``dataset_options.pairing`` is the single-turn type's: sessions replay every human turn.
* ``jsonl``: one conversation per line, ``{"turns": ["...", ...], "output_len": N}`` or chat
  ``{"messages": [...]}``: the ``user`` messages are the turns, an ``assistant`` message
  after one gives that turn's output length (its token count), ``system`` messages before
  the first user turn open every request of the session. In file order; the run records
  the file's sha256 (``Sessions.source``).

The measured sessions are the first ``num_prompts`` usable conversations of that order
(cycled when there are fewer); the warm-ups are taken from the other end, among the
conversations the measured sessions do not use: a warm-up (a session's first turn) never
primes a server's prefix cache with a measured session's first turn. When the file has
fewer usable conversations than ``num_prompts + warmup_requests``, warm-ups are refused
naming the counts (``build_sessions``).

The dataset's own replies are never sent: a session sends the replies the server streamed.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata, resources
from typing import Any

from app.client.datasets.base import (
    AnyTokenizer,
    BuildContext,
    FileDigest,
    WorkloadParams,
    check_cancel,
    dataset_errors,
    json_object_line,
    open_dataset,
    read_dataset,
)
from app.client.datasets.jsonl import output_len_of
from app.client.datasets.sharegpt import (
    DISTRIBUTION,
    NO_FILE,
    PACKAGE,
    PACKAGED_FILE,
    ShareGPTOptions,
    packaged_available,
)

SESSION_DATASETS = ("sharegpt", "jsonl")


@dataclass(frozen=True, slots=True)
class Turn:
    text: str  # the human turn
    output_len: int  # max_tokens asked for the reply


@dataclass(frozen=True, slots=True)
class Conversation:
    turns: tuple[Turn, ...]
    system: tuple[dict[str, Any], ...] = ()  # messages sent before the first turn


@dataclass(frozen=True, slots=True)
class Sessions:
    warmup: list[Conversation]
    measured: list[Conversation]
    source: str | None = None  # the file's identity, as ``Workload.source``


def _check_entry(entry: Any, n: int) -> list[Any]:
    """Entry ``n``'s turns, after its shape is checked (every entry is, used or not)."""
    where = f"dataset_path entry {n + 1}"
    if not isinstance(entry, dict) or not isinstance(entry.get("conversations"), list):
        raise ValueError(f"{where}: expected an object with a 'conversations' list")
    raw: list[Any] = entry["conversations"]
    for k, t in enumerate(raw):
        if not (isinstance(t, dict) and isinstance(t.get("value"), str)):
            raise ValueError(f"{where} turn {k + 1}: a turn needs 'from' and a string 'value'")
    return raw


def _sharegpt_turns(
    raw: list[Any], tok: AnyTokenizer, options: ShareGPTOptions, default_out: int
) -> tuple[Turn, ...]:
    """A checked entry's human turns, up to the first that fails vLLM's length filters
    (``turn_passes``): a session is cut there (its later turns would carry a history
    without it), so one whose first turn fails has none and is dropped."""
    turns: list[Turn] = []
    for k, t in enumerate(raw):
        if t.get("from") != "human" or not t["value"]:
            continue
        nxt = raw[k + 1] if k + 1 < len(raw) else None
        reply = nxt.get("value") if isinstance(nxt, dict) and nxt.get("from") == "gpt" else None
        from_reply = options.output_len is None and isinstance(reply, str)
        counted = max(1, tok.count(reply)) if isinstance(reply, str) else default_out
        n_out = options.output_len or counted
        if not turn_passes(tok.count(t["value"]), n_out, options, from_reply=from_reply):
            break
        turns.append(Turn(t["value"], n_out))
    return tuple(turns)


def turn_passes(prompt_len: int, output_len: int, o: ShareGPTOptions, *, from_reply: bool) -> bool:
    """vLLM's ShareGPT filters on one turn: its own human text (not the history before it)
    at least ``min_len`` and at most ``max_prompt_len`` tokens, text + reply at most
    ``max_total_len``; the reply at least ``min_len`` when its length is the dataset
    reply's (not ``output_len``, nor the run's for a turn with no reply)."""
    return not (
        prompt_len < o.min_len
        or (from_reply and output_len < o.min_len)
        or prompt_len > o.max_prompt_len
        or prompt_len + output_len > o.max_total_len
    )


def _sharegpt_entries(path: str | None, dirs: Sequence[str] | None) -> tuple[list[Any], str]:
    if path is None:
        if not packaged_available():
            raise ValueError(NO_FILE)
        text = resources.files(PACKAGE).joinpath("data", PACKAGED_FILE).read_bytes().decode()
        return _complete_entries(text), f"{DISTRIBUTION} {metadata.version(DISTRIBUTION)}"
    data = read_dataset(path, dirs)
    source = "sha256:" + hashlib.sha256(data).hexdigest()
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"dataset_path: not a ShareGPT JSON array ({e})") from None
    if not isinstance(obj, list):
        raise ValueError("dataset_path: expected a JSON array of conversations")
    return obj, source


def _complete_entries(text: str) -> list[Any]:
    """The entries of a JSON array cut inside its last entry (the packaged file)."""
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    out: list[Any] = []
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return out
        try:
            entry, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return out
        out.append(entry)


def _jsonl_conversation(
    obj: dict[str, Any], lineno: int, tok: AnyTokenizer, default_out: int
) -> Conversation:
    where = f"dataset_path line {lineno}"
    ol = output_len_of(obj, where, default_out)
    if "turns" in obj:
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns:
            raise ValueError(f"{where}: 'turns' must be a non-empty list of strings")
        if not all(isinstance(t, str) and t for t in turns):
            raise ValueError(f"{where}: each turn must be a non-empty string")
        return Conversation(tuple(Turn(t, ol) for t in turns))
    msgs = obj.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ValueError(f"{where}: expected a non-empty 'turns' or 'messages' list")
    system: list[dict[str, Any]] = []
    out: list[Turn] = []
    for k, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise ValueError(f"{where} message {k + 1}: needs a 'role' and a string 'content'")
        role = m.get("role")
        if role == "user":
            out.append(Turn(m["content"], ol))
        elif role == "assistant" and out and "output_len" not in obj:
            out[-1] = Turn(out[-1].text, max(1, tok.count(m["content"])))
        elif role == "system" and not out:
            system.append({"role": "system", "content": m["content"]})
    if not out:
        raise ValueError(f"{where}: no 'user' message")
    return Conversation(tuple(out), tuple(system))


def _take(
    count: int,
    conversation: Callable[[int], Conversation | None],
    n: int,
    w: int,
    cancelled: Callable[[], bool] | None,
) -> tuple[list[Conversation], list[Conversation]]:
    """Up to ``n`` usable conversations from the front of positions ``0..count-1`` and up
    to ``w`` from the back among those past the front's (``conversation(k)``: position
    k's, None when unusable); each position is built at most once."""
    measured: list[Conversation] = []
    reached = 0
    while reached < count and len(measured) < n:
        check_cancel(cancelled, reached)
        c = conversation(reached)
        reached += 1
        if c is not None:
            measured.append(c)
    warm: list[Conversation] = []
    k = count - 1
    while k >= reached and len(warm) < w:
        check_cancel(cancelled, k)
        c = conversation(k)
        k -= 1
        if c is not None:
            warm.append(c)
    return measured, warm


def build_sessions(
    dataset: str,
    params: WorkloadParams,
    options: Any,
    ctx: BuildContext,
    max_turns: int | None,
) -> Sessions:
    """``params.num_prompts`` measured conversations and ``params.warmup_requests`` warm-up
    ones, never the same conversation (module docstring), each cut to ``max_turns`` turns."""
    with dataset_errors():
        return _build(dataset, params, options, ctx, max_turns)


def _build(
    dataset: str,
    params: WorkloadParams,
    options: Any,
    ctx: BuildContext,
    max_turns: int | None,
) -> Sessions:
    tok = ctx.tokenizer
    n, w = params.prompts, params.warmup_requests
    source: str | None = None
    if dataset == "sharegpt":
        assert isinstance(options, ShareGPTOptions)
        entries, source = _sharegpt_entries(params.dataset_path, ctx.dataset_dirs)
        checked = [_check_entry(e, i) for i, e in enumerate(entries)]
        order = list(range(len(entries)))
        random.Random(params.seed).shuffle(order)

        def conversation(k: int) -> Conversation | None:
            turns = _sharegpt_turns(checked[order[k]], tok, options, params.output_len)
            return Conversation(turns) if turns else None

        measured, warm = _take(len(order), conversation, n, w, ctx.cancelled)
    elif dataset == "jsonl":
        if not params.dataset_path:
            raise ValueError("dataset_path is required when dataset is 'jsonl'")
        digest = FileDigest()
        convs: list[Conversation] = []
        lines = open_dataset(params.dataset_path, ctx.dataset_dirs, digest.update)
        for lineno, line in enumerate(lines, 1):
            check_cancel(ctx.cancelled, lineno)
            if line.strip():
                obj = json_object_line(line, lineno, " with 'turns' or 'messages'")
                convs.append(_jsonl_conversation(obj, lineno, tok, params.output_len))
        source = digest.source()
        measured, warm = _take(len(convs), convs.__getitem__, n, w, ctx.cancelled)
    else:
        raise ValueError(f"dataset: multi_turn needs one of {', '.join(SESSION_DATASETS)}")
    if not measured:
        raise ValueError("dataset_path: no conversation with a human/user turn in the file")
    if len(warm) < w:
        usable = len(measured) + len(warm)  # every conversation was looked at
        raise ValueError(
            f"warmup_requests: {w} warm-up sessions need conversations apart from the "
            f"{n} measured sessions' (a warm-up would prime a measured session's first turn "
            f"in the server's prefix cache), and the file has {usable} usable: give "
            f"num_prompts + warmup_requests {usable} or fewer"
        )
    if max_turns is not None:
        measured = [Conversation(c.turns[:max_turns], c.system) for c in measured]
        warm = [Conversation(c.turns[:max_turns], c.system) for c in warm]
    measured = [measured[i % len(measured)] for i in range(n)]
    return Sessions(warm, measured, source)
