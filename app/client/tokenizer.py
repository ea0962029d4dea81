"""Tokenizers: a documented built-in one, or a Hugging Face ``tokenizer.json`` from a local path.

The built-in tokenizer ("tokentrace-words-v1") splits text into pre-tokens the way GPT-style
BPE tokenizers do before merging: a run of letters/digits with at most one leading space,
or one other non-space character with at most one leading space, or a run of whitespace.
It has a fixed vocabulary of common English words (``WORDS``) used to build random prompts
whose length is exact under it. It is deterministic, needs no download, and is what the
simulator emits, so simulator runs have exact token counts. Against a real model's
tokenizer it is an approximation: pass ``--tokenizer PATH`` for exact counts.

A run's ``tokenizer`` path is hostile input on a worker, as its ``dataset_path`` is: given
``dirs`` (the worker's dataset directories), only a regular ``tokenizer.json`` (or a folder
holding one) inside them is read, symlinks resolved, at most ``MAX_TOKENIZER_BYTES``; every
refusal reads the same (``REFUSED``), whatever exists on the worker.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

PRETOKEN = re.compile(r" ?[A-Za-z0-9]+| ?[^\sA-Za-z0-9]|\s+(?!\S)|\s+")

_WORD_TEXT = """
    the of and to in is was for on that with as by at from his her it an were are which this
    be or has had not but first one their its new after who they have two been more other she
    when all time during into school there year city some only world also over three many
    most team later such up where these would can no may under since between about out high
    four both then part about against through each called state made while five known well
    before used season several because series united him won being film national use them well
    people work life any so did even back number group same music second day found family
    led left while early show game took main around band line place house name form area
    company system home power period great last small large long old public end set three
    water light paper model token speed measure bench server stream latency time value test
    data point river north south east west field market value order study class level plan"""
WORDS: tuple[str, ...] = tuple(dict.fromkeys(_WORD_TEXT.split()))


MAX_TOKENIZER_BYTES = 256 << 20
REFUSED = (
    "tokenizer: not a tokenizer this worker may read (a tokenizer.json, or a folder holding "
    "one, inside its dataset directories: TOKENTRACE_DATASET_DIRS or --dataset-dir)"
)


def _inside(path: str, dirs: Sequence[str]) -> str:
    """``path`` resolved (symlinks followed), when it is inside one of ``dirs``."""
    try:
        real = os.path.realpath(path, strict=True)
    except (OSError, ValueError):
        raise ValueError(REFUSED) from None
    roots = [os.path.realpath(d) for d in dirs]
    if not any(os.path.commonpath([real, r]) == r for r in roots):
        raise ValueError(REFUSED)
    return real


def read_tokenizer_file(path: str, dirs: Sequence[str] | None) -> bytes:
    """A regular file's bytes, at most ``MAX_TOKENIZER_BYTES``; ``dirs`` None: anywhere
    (the local CLI's own files), else only inside ``dirs`` (``REFUSED`` otherwise)."""
    if dirs is not None:
        path = _inside(path, dirs)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
    except (OSError, ValueError):
        why = REFUSED if dirs is not None else f"tokenizer: cannot read {path}"
        raise ValueError(why) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(REFUSED if dirs is not None else f"tokenizer: {path} is not a file")
        data = f.read(MAX_TOKENIZER_BYTES + 1)
    if len(data) > MAX_TOKENIZER_BYTES:
        raise ValueError(f"tokenizer: the file is larger than {MAX_TOKENIZER_BYTES >> 20} MiB")
    return data


class Tokenizer(Protocol):
    @property
    def name(self) -> str: ...

    def count(self, text: str) -> int: ...

    def token_starts(self, text: str) -> list[int]:
        """Character offset at which each token starts, in order."""
        ...


@dataclass(frozen=True)
class BuiltinTokenizer:
    name: str = "tokentrace-words-v1"

    def count(self, text: str) -> int:
        return len(PRETOKEN.findall(text))

    def count_encoded(self, text: str) -> int:
        """As ``count``: this tokenizer adds no special tokens."""
        return self.count(text)

    def token_starts(self, text: str) -> list[int]:
        return [m.start() for m in PRETOKEN.finditer(text)]

    def random_text(self, n_tokens: int, rng_ints: list[int]) -> str:
        """Exactly ``n_tokens`` tokens: words chosen by ``rng_ints`` (indices into WORDS)."""
        if n_tokens <= 0:
            return ""
        words = [WORDS[i % len(WORDS)] for i in rng_ints[:n_tokens]]
        return words[0] + "".join(" " + w for w in words[1:])


class HFTokenizer:
    """A Hugging Face ``tokenizers`` tokenizer loaded from a local file or folder; with
    ``dirs``, only from inside them (``read_tokenizer_file``)."""

    def __init__(self, path: str, dirs: Sequence[str] | None = None) -> None:
        from tokenizers import Tokenizer as _Tok

        p = Path(_inside(path, dirs) if dirs is not None else path)
        file = p / "tokenizer.json" if p.is_dir() else p
        if dirs is None and not file.is_file():
            raise ValueError(f"tokenizer: no tokenizer.json at {path}")
        data = read_tokenizer_file(str(file), dirs)
        try:
            self._tok = _Tok.from_str(data.decode("utf-8"))
        except Exception:  # tokenizers raises its own Exception for a file it cannot read
            raise ValueError(
                f"tokenizer: {path} is not a Hugging Face tokenizer.json"
                if dirs is None
                else REFUSED
            ) from None
        self.name = f"hf:{file}"

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def count_encoded(self, text: str) -> int:
        """The tokens of ``tokenizer(text).input_ids`` (Hugging Face's default encoding):
        the special tokens its post-processor adds (a BOS) included, as vLLM's benchmark
        datasets count a prompt and a reply."""
        return len(self._tok.encode(text, add_special_tokens=True).ids)

    def token_starts(self, text: str) -> list[int]:
        return [s for s, _ in self._tok.encode(text, add_special_tokens=False).offsets]

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids))

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size())


def load_tokenizer(
    path: str | None, dirs: Sequence[str] | None = None
) -> BuiltinTokenizer | HFTokenizer:
    """The built-in tokenizer, or ``path``'s (with ``dirs``: only inside them)."""
    return BuiltinTokenizer() if path is None else HFTokenizer(path, dirs)


def tokens_per_chunk(tok: Tokenizer, chunks: list[str]) -> list[int]:
    """Assign each token of the concatenated text to the chunk in which it starts.

    Tokenizing the whole text once (not each chunk alone) keeps the count exact for tokens
    that a tokenizer would merge across chunk boundaries.
    """
    counts = [0] * len(chunks)
    if not chunks:
        return counts
    text = "".join(chunks)
    ends: list[int] = []
    pos = 0
    for c in chunks:
        pos += len(c)
        ends.append(pos)
    j = 0
    for start in tok.token_starts(text):
        while j < len(ends) - 1 and start >= ends[j]:
            j += 1
        counts[j] += 1
    return counts
