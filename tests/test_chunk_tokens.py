"""Token counting a window at a time (``ChunkTokens``, issue 23 item 6): the same counts per
chunk as tokenizing the whole text at once (``tokens_per_chunk``, the definition), in
memory that does not grow with the text."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from app.client.chunk_tokens import ChunkTokens
from app.client.tokenizer import WORDS, BuiltinTokenizer, HFTokenizer, tokens_per_chunk
from tests.test_datasets import hf_tokenizer  # noqa: F401  (a fixture)

PIECES = [*WORDS[:40], " ", "  ", "\n", "\n\n", "\t", ".", ",", "!?", "12", "345", "é", "日本",
          " x", "a-b", "   y", "--", "\u00a0", "'s", "\r\n"]  # fmt: skip


def _chunks(seed: int, n: int) -> list[str]:
    """Stream-like chunks: pieces joined a few at a time, cut at any character."""
    rng = np.random.default_rng(seed)
    text = "".join(rng.choice(PIECES, 4 * n))
    cuts = np.sort(rng.choice(np.arange(1, len(text)), n - 1, replace=False))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def _windowed(tok: BuiltinTokenizer | HFTokenizer, chunks: list[str], window: int) -> list[int]:
    ct = ChunkTokens(tok, window_chars=window)
    for c in chunks:
        ct.add(c)
    return list(ct.finish())


@pytest.mark.parametrize("window", [1, 7, 64, 1000, 1 << 18])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_builtin_windows_count_exactly(seed: int, window: int) -> None:
    tok = BuiltinTokenizer()
    chunks = _chunks(seed, 3000)
    want = tokens_per_chunk(tok, chunks)
    assert sum(want) > 3000
    assert _windowed(tok, chunks, window) == want


def test_builtin_whitespace_runs_across_windows() -> None:
    """The pre-token rule that looks past a token (a run of spaces before a word gives its
    last space to the word) at every window edge."""
    tok = BuiltinTokenizer()
    chunks = ["a", "   ", "   ", " b", "  ", "\n", "  c", " " * 50, "d"] * 200
    want = tokens_per_chunk(tok, chunks)
    for window in (1, 2, 3, 5, 13, 100):
        assert _windowed(tok, chunks, window) == want, window


@pytest.mark.parametrize("window", [64, 1000, 4096])
def test_hf_windows_count_exactly(hf_tokenizer: HFTokenizer, window: int) -> None:  # noqa: F811
    chunks = _chunks(7, 2000)
    want = tokens_per_chunk(hf_tokenizer, chunks)
    assert _windowed(hf_tokenizer, chunks, window) == want


def test_counts_match_the_whole_text_total() -> None:
    """Independent of chunking: the windowed per-chunk counts sum to the whole text's count."""
    tok = BuiltinTokenizer()
    chunks = _chunks(3, 5000)
    assert sum(_windowed(tok, chunks, 97)) == tok.count("".join(chunks))


def test_memory_does_not_grow_with_the_text() -> None:
    """100,000 one-token chunks with a 4 Ki-character window: what is held is an int per
    chunk and the window, not the whole text and every token's offset."""
    tok = BuiltinTokenizer()
    chunks = [" word"] * 100_000

    def peak_of(count: object) -> int:
        tracemalloc.start()
        try:
            counts = count()  # type: ignore[operator]
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert list(counts) == [1] * 100_000
        return int(peak)

    whole = peak_of(lambda: tokens_per_chunk(tok, chunks))
    windowed = peak_of(lambda: _windowed(tok, chunks, 4096))
    # the windowed way's own list of results (8 bytes a chunk) is the bulk of what it holds
    assert windowed < 8 * 100_000 * 1.3 + 200_000 < whole / 3, (windowed, whole)
