"""Tokens per chunk of a stream's text, counted a window at a time (``ChunkTokens``): the
counts ``app.client.tokenizer.tokens_per_chunk`` gives tokenizing the whole text at once, in
memory that does not grow with the text (issue 23: a 60 MB reply took +1.36 GB as a list
of every token's offset)."""

from __future__ import annotations

from array import array
from bisect import bisect_left

from app.client.tokenizer import Tokenizer

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
