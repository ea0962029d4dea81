"""Dataset type ``mooncake``: replay a Mooncake trace (one JSON object per line:
``timestamp`` in ms from the trace's start, ``input_length``, ``output_length``,
``hash_ids``).

* **Arrivals**: request k is sent at ``(timestamp_k - timestamp_0) / speedup`` after the
  measured phase starts (``Workload.at_ns``): the trace's own schedule, in place of the
  load shape (a run giving ``request_rate``, ``arrival``, ``burstiness`` or a ramp-up is
  refused). Its first ``num_prompts`` lines are replayed (a shorter trace is refused), every
  line when ``num_prompts`` is not given (``trace_times``).
* **Prompts** are built from blocks: each hash id names one block of ``block_size`` tokens
  (512, as in Mooncake's traces), drawn from the seed and the id alone, so equal ids give
  identical token blocks in every request and a server's prefix cache sees the trace's
  reuse. A request is its first ``ceil(input_length / block_size)`` blocks, the last one
  cut to what is left (a partial block is the first tokens of the same block). Under the
  built-in tokenizer the prompt is exactly ``input_length`` tokens; under a Hugging Face
  tokenizer a block is ``block_size`` random token ids decoded on their own (the same text
  for an id in every request), the blocks' texts joined, and the recorded input tokens are
  the joined text re-encoded (a boundary may merge, so the count may differ a little).
* **Stats**: ``prefix_reuse_ratio``, the fraction of the replayed requests' blocks whose
  hash id appeared earlier in them (``Workload.stats``, stored in ``load_stats.workload``).
* Warm-ups take lengths from the trace's last lines and blocks of their own (another seed
  stream), so they never fill the prefix cache for the measured requests.
* **Identity**: the run records the trace file's sha256 (``Workload.source``).

Bad input (a timestamp that decreases, is not a finite number of ms, or is out of range; a
length below 1 or over ``MAX_LENGTH``; ``hash_ids`` too short for ``input_length`` at the
block size, a non-integer id; NaN, Infinity or an integer of over 4300 digits anywhere) is a
``ValueError`` naming the line and field, raised while the workload is built: nothing is
sent.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from app.client.datasets.base import (
    MAX_PROMPT_TOKENS,
    AnyTokenizer,
    BuildContext,
    FileDigest,
    Prompt,
    Workload,
    WorkloadParams,
    check_cancel,
    json_object_line,
    open_dataset,
)
from app.client.datasets.trace_times import replayed, schedule_ns, timestamp_of
from app.client.tokenizer import WORDS, BuiltinTokenizer

MAX_LENGTH = 1_000_000  # tokens of one request's input or output


class MooncakeOptions(BaseModel):
    model_config = {"extra": "forbid"}

    block_size: int = Field(
        512, ge=1, le=1_000_000, description="prompt tokens per hash id (Mooncake: 512)"
    )
    speedup: float = Field(
        1.0, gt=0, le=1_000_000, description="divide the trace's timestamps by this"
    )


@dataclass(frozen=True, slots=True)
class TraceLine:
    lineno: int
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _int_field(obj: dict[str, Any], key: str, where: str) -> int:
    v = obj.get(key)
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"{where}: '{key}' must be an integer")
    if v < 1:
        raise ValueError(f"{where}: '{key}' must be a positive integer, got {max(v, -(10**9))}")
    if v > MAX_LENGTH:
        raise ValueError(f"{where}: '{key}' is over {MAX_LENGTH:,} tokens")
    return v


def parse_trace_line(line: str, lineno: int, previous: float | None, block_size: int) -> TraceLine:
    where = f"dataset_path line {lineno}"
    obj = json_object_line(line, lineno, "")
    ts = timestamp_of(obj, where, previous)
    n_in = _int_field(obj, "input_length", where)
    n_out = _int_field(obj, "output_length", where)
    ids = obj.get("hash_ids")
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in ids
    ):
        raise ValueError(f"{where}: 'hash_ids' must be a list of integers")
    need = math.ceil(n_in / block_size)
    if len(ids) < need:
        raise ValueError(
            f"{where}: 'hash_ids' has {len(ids)} ids, too few for input_length {n_in} "
            f"(blocks of {block_size} tokens need {need})"
        )
    return TraceLine(lineno, ts, n_in, n_out, tuple(ids[:need]))


def load_trace(
    path: str,
    block_size: int,
    dirs: Any = None,
    cancelled: Callable[[], bool] | None = None,
    digest: Callable[[bytes], None] | None = None,
) -> list[TraceLine]:
    out: list[TraceLine] = []
    previous: float | None = None
    for lineno, line in enumerate(open_dataset(path, dirs, digest), start=1):
        check_cancel(cancelled, lineno)
        if not line.strip():
            continue
        t = parse_trace_line(line, lineno, previous, block_size)
        previous = t.timestamp_ms
        out.append(t)
    if not out:
        raise ValueError("dataset_path: no requests in the trace")
    return out


def prefix_reuse_ratio(lines: list[TraceLine]) -> float | None:
    """Fraction of the lines' blocks whose hash id appeared earlier in them (None: no blocks)."""
    seen: set[int] = set()
    total = reused = 0
    for t in lines:
        for h in t.hash_ids:
            total += 1
            if h in seen:
                reused += 1
            else:
                seen.add(h)
    return reused / total if total else None


class BlockPrompts:
    """Prompts made of blocks: one block of ``block_size`` tokens per hash id, the same
    for an id in every request (drawn from ``(seed, stream, id)`` alone). Each block's text
    (whole, or its first tokens for a request's last block) is made once and kept."""

    def __init__(self, tok: AnyTokenizer, block_size: int, seed: int, stream: int) -> None:
        self.tok = tok
        self.block_size = block_size
        self.seed = seed
        self.stream = stream
        self.texts: dict[tuple[int, int], str] = {}

    def block(self, hash_id: int) -> list[int]:
        """The block's token indices (words of the built-in tokenizer, or token ids)."""
        rng = np.random.default_rng(
            np.random.SeedSequence([self.seed, self.stream, hash_id & (2**63 - 1)])
        )
        high = len(WORDS) if isinstance(self.tok, BuiltinTokenizer) else self.tok.vocab_size
        out: list[int] = rng.integers(0, high, size=self.block_size).tolist()
        return out

    def block_text(self, hash_id: int, take: int) -> str:
        """The text of the block's first ``take`` tokens (built-in: exactly ``take``)."""
        key = (hash_id, take)
        text = self.texts.get(key)
        if text is None:
            ids = self.block(hash_id)[:take]
            if isinstance(self.tok, BuiltinTokenizer):
                text = self.tok.random_text(take, ids)
            else:
                text = self.tok.decode(ids)
            self.texts[key] = text
        return text

    def prompt(self, t: TraceLine) -> Prompt:
        parts: list[str] = []
        left = t.input_length
        for h in t.hash_ids:
            take = min(left, self.block_size)
            parts.append(self.block_text(h, take))
            left -= take
        if isinstance(self.tok, BuiltinTokenizer):
            # words joined by one space: one word one token, so exactly input_length
            return Prompt(" ".join(parts), None, t.input_length, t.output_length)
        # a Hugging Face tokenizer: each block's ids decoded on their own, so an id's text is
        # the same in every request; the count is the whole text re-encoded
        text = "".join(parts)
        return Prompt(text, None, self.tok.count(text), t.output_length)


def _budget(lines: list[TraceLine]) -> None:
    total = sum(t.input_length for t in lines)
    if total > MAX_PROMPT_TOKENS:
        raise ValueError(
            f"dataset_path: the replayed requests hold {total:,} prompt tokens, over the "
            f"client's budget of {MAX_PROMPT_TOKENS:,}"
        )


class MooncakeDataset:
    name = "mooncake"
    summary = "replay a Mooncake trace: its timestamps, lengths and hash_ids blocks"
    options: type[BaseModel] = MooncakeOptions
    timed = True  # the trace gives the send times (Workload.at_ns)

    def check(self, params: WorkloadParams, options: BaseModel) -> None:
        if not params.dataset_path:
            raise ValueError("dataset_path is required when dataset is 'mooncake'")

    def prompt_tokens(self, params: WorkloadParams, options: BaseModel) -> int | None:
        return None  # bounded by the file's size, checked while building

    def build(self, params: WorkloadParams, options: BaseModel, ctx: BuildContext) -> Workload:
        assert isinstance(options, MooncakeOptions) and params.dataset_path is not None
        digest = FileDigest()
        lines = load_trace(
            params.dataset_path, options.block_size, ctx.dataset_dirs, ctx.cancelled, digest.update
        )
        measured_lines = lines[: replayed(len(lines), params.num_prompts, "requests")]
        warm_lines = [lines[-1 - (i % len(lines))] for i in range(params.warmup_requests)]
        _budget(measured_lines + warm_lines)
        at = schedule_ns(
            [t.timestamp_ms for t in measured_lines],
            [t.lineno for t in measured_lines],
            options.speedup,
        )
        blocks = BlockPrompts(ctx.tokenizer, options.block_size, params.seed, 0)
        measured = []
        for i, t in enumerate(measured_lines):
            check_cancel(ctx.cancelled, i)
            measured.append(blocks.prompt(t))
        warm_blocks = BlockPrompts(ctx.tokenizer, options.block_size, params.seed, 2)
        warm = [warm_blocks.prompt(t) for t in warm_lines]
        stats: dict[str, object] = {
            "kind": "trace",
            "speedup": options.speedup,
            "block_size": options.block_size,
            "prefix_reuse_ratio": prefix_reuse_ratio(measured_lines),
            "trace_span_ms": measured_lines[-1].timestamp_ms - measured_lines[0].timestamp_ms,
        }
        return Workload(warm, measured, digest.source(), at_ns=at, stats=stats)


MOONCAKE = MooncakeDataset()
