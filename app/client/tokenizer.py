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
from array import array
from bisect import bisect_left
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


WINDOW_CHARS = 1 << 18  # a stream's text up to this size is tokenized whole, longer in windows
_KEEP_TOKENS = 8  # a window's last tokens, counted with the next window instead
_CONTEXT_TOKENS = 8  # tokens before a window's start tokenized with it (not counted again)


class ChunkTokens:
    """``tokens_per_chunk`` for chunks given one at a time (``add``), holding a window of text
    rather than the whole text and a list of every token: ``counts`` (one int per chunk) is
    all that grows with the stream.

    A text of at most ``window_chars`` characters is tokenized once, whole, at ``finish``:
    exactly ``tokens_per_chunk``. A longer one is tokenized a window at a time. A window's
    tokens are final but for its last ``_KEEP_TOKENS``: the next window starts where the
    first of those starts, with the ``_CONTEXT_TOKENS`` tokens before it as context (their
    tokens are not counted again). For the built-in tokenizer that is exact: a pre-token
    depends on the text up to one character past it, so only a window's last token can
    differ from the whole text's, and tokenizing from a token's start repeats the whole
    text's tokens from there. A Hugging Face tokenizer splits text into pre-tokens (words)
    the same way and merges within them, so it is exact unless one word outlasts the
    context (e.g. a run of thousands of digits).
    """

    __slots__ = ("_ctx", "_first", "_next", "_pending", "_texts", "_tok", "_window", "counts")

    def __init__(self, tok: Tokenizer, window_chars: int = WINDOW_CHARS) -> None:
        self._tok = tok
        self._window = window_chars
        self._next = window_chars  # pending text that triggers the next window
        self.counts: array[int] = array("i")  # tokens per chunk, of the chunks windowed
        self._ctx = ""  # text before the pending text, tokenized again for context
        self._texts: list[str] = []  # the pending text, by chunk (the first maybe its tail)
        self._first = 0  # the chunk index of ``_texts[0]``
        self._pending = 0  # characters in ``_texts``

    def add(self, text: str) -> None:
        """The next chunk's text."""
        self._texts.append(text)
        self._pending += len(text)
        if self._pending >= self._next:
            self._window_step(final=False)

    def finish(self) -> array[int]:
        """Count what is left; the tokens of each chunk, in order."""
        self._window_step(final=True)
        return self.counts

    def _window_step(self, *, final: bool) -> None:
        texts = self._texts
        counts = self.counts
        first_idx = self._first
        if len(counts) < first_idx + len(texts):  # room for the chunks added since
            counts.frombytes(bytes(counts.itemsize * (first_idx + len(texts) - len(counts))))
        if not texts:
            return
        base = len(self._ctx)
        text = self._ctx + "".join(texts)
        starts = self._tok.token_starts(text)
        first = bisect_left(starts, base)  # the first token at or after ``base``
        if final:
            cut = len(text)
        else:
            # tokens starting at the same offset (the bytes of one character) stay together
            cut = starts[-_KEEP_TOKENS] if len(starts) >= _KEEP_TOKENS else base
            if cut <= base:  # too few tokens to move on: wait for more text
                self._next = 2 * self._pending
                return
        cut_i = bisect_left(starts, cut)  # the tokens before it are counted now
        j = 0
        last = len(texts) - 1
        seg_end = base + len(texts[0])
        for i in range(first, cut_i):
            st = starts[i]
            while st >= seg_end and j < last:
                j += 1
                seg_end += len(texts[j])
            counts[first_idx + j] += 1
        if final:
            self._texts, self._ctx, self._pending = [], "", 0
            self._first += len(texts)
            return
        # the pending text from ``cut`` on, by chunk; the context before it
        pos = base
        j = 0
        while pos + len(texts[j]) <= cut:  # chunks wholly before the cut
            pos += len(texts[j])
            j += 1
        rest = [texts[j][cut - pos :], *texts[j + 1 :]]
        self._texts = rest
        self._first = first_idx + j
        self._pending = len(text) - cut
        self._ctx = text[starts[max(0, cut_i - _CONTEXT_TOKENS)] : cut]
        self._next = max(self._window, 2 * self._pending)
