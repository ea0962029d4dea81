"""Whole conversations for multi-turn sessions (``RunSpec.multi_turn``): each one's human
turns in order, with the output length asked for each reply.

* ``sharegpt``: a ShareGPT JSON array (``dataset_path``, or the packaged file). A turn is a
  ``human`` entry; its output length is the token count of the ``gpt`` reply right after it
  (``dataset_options.output_len`` overrides it; a human turn with no reply after it gets the
  run's ``output_len``). Conversations are shuffled with ``random.Random(seed)``, as the
  single-turn type draws them. vLLM's length filters (``dataset_options`` ``min_len``,
  ``max_prompt_len``, ``max_total_len``) apply to each turn's own text and reply: a session
  is cut before its first failing turn, and dropped when that is its first (or it has no
  human turn).
* ``jsonl``: one conversation per line, ``{"turns": ["...", ...], "output_len": N}`` or chat
  ``{"messages": [...]}``: the ``user`` messages are the turns, an ``assistant`` message
  after one gives that turn's output length (its token count), ``system`` messages before
  the first user turn open every request of the session. In file order, cycled; the run
  records the file's sha256 (``Sessions.source``).

The dataset's own replies are never sent: a session sends the replies the server streamed.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata, resources
from typing import Any

from app.client.datasets.base import (
    AnyTokenizer,
    BuildContext,
    FileDigest,
    WorkloadParams,
    check_cancel,
    open_dataset,
    read_dataset,
)
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


def _sharegpt_turns(
    entry: Any, n: int, tok: AnyTokenizer, options: ShareGPTOptions, default_out: int
) -> tuple[Turn, ...]:
    """The entry's human turns, up to the first that fails vLLM's length filters
    (``turn_passes``): a session is cut there (its later turns would carry a history
    without it), so one whose first turn fails has none and is dropped."""
    where = f"dataset_path entry {n + 1}"
    if not isinstance(entry, dict) or not isinstance(entry.get("conversations"), list):
        raise ValueError(f"{where}: expected an object with a 'conversations' list")
    raw = entry["conversations"]
    turns: list[Turn] = []
    for k, t in enumerate(raw):
        if not (isinstance(t, dict) and isinstance(t.get("value"), str)):
            raise ValueError(f"{where} turn {k + 1}: a turn needs 'from' and a string 'value'")
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


def _jsonl_conversation(obj: Any, lineno: int, tok: AnyTokenizer, default_out: int) -> Conversation:
    where = f"dataset_path line {lineno}"
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object with 'turns' or 'messages'")
    ol = obj.get("output_len", default_out)
    if not isinstance(ol, int) or isinstance(ol, bool) or ol < 1:
        raise ValueError(f"{where}: 'output_len' must be a positive integer")
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


def build_sessions(
    dataset: str,
    params: WorkloadParams,
    options: Any,
    ctx: BuildContext,
    max_turns: int | None,
) -> Sessions:
    """``params.num_prompts`` measured conversations and ``params.warmup_requests`` warm-up
    ones (from the other end of the order), each cut to ``max_turns`` turns."""
    tok = ctx.tokenizer
    convs: list[Conversation] = []
    source: str | None = None
    if dataset == "sharegpt":
        assert isinstance(options, ShareGPTOptions)
        entries, source = _sharegpt_entries(params.dataset_path, ctx.dataset_dirs)
        order = list(range(len(entries)))
        random.Random(params.seed).shuffle(order)
        for k, i in enumerate(order):
            check_cancel(ctx.cancelled, k)
            turns = _sharegpt_turns(entries[i], i, tok, options, params.output_len)
            if turns:
                convs.append(Conversation(turns))
    elif dataset == "jsonl":
        if not params.dataset_path:
            raise ValueError("dataset_path is required when dataset is 'jsonl'")
        digest = FileDigest()
        lines = open_dataset(params.dataset_path, ctx.dataset_dirs, digest.update)
        for lineno, line in enumerate(lines, 1):
            check_cancel(ctx.cancelled, lineno)
            if line.strip():
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    where = f"dataset_path line {lineno}"
                    raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
                convs.append(_jsonl_conversation(obj, lineno, tok, params.output_len))
        source = digest.source()
    else:
        raise ValueError(f"dataset: multi_turn needs one of {', '.join(SESSION_DATASETS)}")
    if not convs:
        raise ValueError("dataset_path: no conversation with a human/user turn in the file")
    if max_turns is not None:
        convs = [Conversation(c.turns[:max_turns], c.system) for c in convs]
    measured = [convs[i % len(convs)] for i in range(params.num_prompts)]
    warm = [convs[-1 - (i % len(convs))] for i in range(params.warmup_requests)]
    return Sessions(warm, measured, source)
