"""Tokenizers: a documented built-in one, or a Hugging Face ``tokenizer.json`` from a local path.

The built-in tokenizer ("tokentrace-words-v1") splits text into pre-tokens the way GPT-style
BPE tokenizers do before merging: a run of letters/digits with at most one leading space,
or one other non-space character with at most one leading space, or a run of whitespace.
It has a fixed vocabulary of common English words (``WORDS``) used to build random prompts
whose length is exact under it. It is deterministic, needs no download, and is what the
simulator emits, so simulator runs have exact token counts. Against a real model's
tokenizer it is an approximation: pass ``--tokenizer PATH`` for exact counts.
"""

from __future__ import annotations

import json
import re
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

    def token_starts(self, text: str) -> list[int]:
        return [m.start() for m in PRETOKEN.finditer(text)]

    def random_text(self, n_tokens: int, rng_ints: list[int]) -> str:
        """Exactly ``n_tokens`` tokens: words chosen by ``rng_ints`` (indices into WORDS)."""
        if n_tokens <= 0:
            return ""
        words = [WORDS[i % len(WORDS)] for i in rng_ints[:n_tokens]]
        return words[0] + "".join(" " + w for w in words[1:])


class HFTokenizer:
    """A Hugging Face ``tokenizers`` tokenizer loaded from a local file or folder."""

    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer as _Tok

        p = Path(path)
        file = p / "tokenizer.json" if p.is_dir() else p
        if not file.is_file():
            raise ValueError(f"tokenizer: no tokenizer.json at {path}")
        self._tok = _Tok.from_file(str(file))
        self.name = f"hf:{file}"
        cfg = file.parent / "tokenizer_config.json"
        self._bos: str | None = None
        if cfg.is_file():
            try:
                bos = json.loads(cfg.read_text()).get("bos_token")
                self._bos = bos if isinstance(bos, str) else None
            except (OSError, ValueError):
                self._bos = None

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def token_starts(self, text: str) -> list[int]:
        return [s for s, _ in self._tok.encode(text, add_special_tokens=False).offsets]

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids))

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size())


def load_tokenizer(path: str | None) -> BuiltinTokenizer | HFTokenizer:
    return BuiltinTokenizer() if path is None else HFTokenizer(path)


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
