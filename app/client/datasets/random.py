"""Dataset type ``random``: seeded random prompts of an exact token length under the run's
tokenizer, optionally of varied lengths (``range_ratio``) behind one shared prefix
(``prefix_len``), as ``vllm bench serve --dataset-name random`` builds them.

* built-in tokenizer: ``BuiltinTokenizer.random_text`` over seeded word indices (one word,
  one token, by construction); a prefix and a body join with one space, which starts the
  body's first token, so the joined text is exactly prefix + body tokens;
* Hugging Face tokenizer: sample token ids, decode, re-encode, then trim or pad with more
  sampled ids and repeat until the re-encoded length is exact (as vLLM's random dataset
  does, but never accepting a near miss). Behind a prefix the whole text is re-encoded:
  it must keep the prefix's own tokens (no merge across the boundary; else new ids are
  drawn) and add exactly the body's length.

Lengths (``range_ratio`` r, vLLM's rule): input uniform over the integers
[floor(L(1-r)), ceil(L(1+r))], output over [max(1, floor(O(1-r))), ceil(O(1+r))]; the
prompt is ``prefix_len`` tokens + the sampled input length. Measured prompts come from the
seed's stream 0 (their lengths from stream 3, the prefix from stream 4), warm-ups from
streams 2, 5 and 6: the measured prompts do not depend on the warm-up count, and the
warm-ups' prefix is their own, so they do not fill a server's prefix cache for the
measured requests.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from pydantic import BaseModel, Field

from app.client.datasets.base import (
    AnyTokenizer,
    BuildContext,
    Prompt,
    Workload,
    WorkloadParams,
    check_cancel,
)
from app.client.tokenizer import WORDS, BuiltinTokenizer, HFTokenizer

MAX_ATTEMPTS = 16  # fresh draws of ids before a prompt of the exact length is given up


def random_prompt_text(tok: AnyTokenizer, n_tokens: int, rng: np.random.Generator) -> str:
    """A random text of exactly ``n_tokens`` tokens under ``tok``."""
    if isinstance(tok, BuiltinTokenizer):
        idx = rng.integers(0, len(WORDS), size=n_tokens).tolist()
        return tok.random_text(n_tokens, idx)
    return _hf_random_text(tok, n_tokens, rng)


def _hf_random_text(tok: HFTokenizer, n_tokens: int, rng: np.random.Generator) -> str:
    vocab = tok.vocab_size
    for _attempt in range(8):
        ids = rng.integers(0, vocab, size=n_tokens).tolist()
        for _ in range(32):
            text = tok.decode(ids)
            ids = tok.encode(text)
            if len(ids) == n_tokens:
                return text
            if len(ids) > n_tokens:
                ids = ids[:n_tokens]
            else:
                ids = ids + rng.integers(0, vocab, size=n_tokens - len(ids)).tolist()
    raise ValueError(
        f"could not build a prompt of exactly {n_tokens} tokens with {tok.name} "
        "(decode/re-encode never converged)"
    )


def text_after(tok: AnyTokenizer, head: str, n_tokens: int, rng: np.random.Generator) -> str:
    """``head`` followed by random text: the whole is ``head``'s tokens, unchanged, then
    exactly ``n_tokens`` more under ``tok``."""
    if not head:
        return random_prompt_text(tok, n_tokens, rng)
    if n_tokens == 0:
        return head
    if isinstance(tok, BuiltinTokenizer):
        return head + " " + random_prompt_text(tok, n_tokens, rng)
    head_ids = tok.encode(head)
    p, vocab = len(head_ids), tok.vocab_size
    for _attempt in range(MAX_ATTEMPTS):
        ids = rng.integers(0, vocab, size=n_tokens).tolist()
        for _ in range(32):
            text = head + tok.decode(ids)
            full = tok.encode(text)
            if full[:p] != head_ids:
                break  # the body merged into the head's last token: draw new ids
            body = full[p:]
            if len(body) == n_tokens:
                return text
            if len(body) > n_tokens:
                ids = body[:n_tokens]
            else:
                ids = body + rng.integers(0, vocab, size=n_tokens - len(body)).tolist()
    raise ValueError(
        f"could not build {n_tokens} tokens after a {p}-token prefix with {tok.name} "
        "(decode/re-encode never converged)"
    )


def length_bounds(length: int, ratio: float, low_at_least: int = 0) -> tuple[int, int]:
    """vLLM's integer range around ``length``: [floor(L(1-r)), ceil(L(1+r))]."""
    low = max(low_at_least, math.floor(length * (1 - ratio)))
    return low, max(low, math.ceil(length * (1 + ratio)))


class RandomOptions(BaseModel):
    model_config = {"extra": "forbid"}

    range_ratio: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="input and output lengths uniform over the integers in "
        "[L(1-r), L(1+r)] (seeded); 0 = every prompt exactly input_len",
    )
    prefix_len: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="tokens of one random prefix every prompt starts with; the prompt is "
        "prefix_len + the sampled input length",
    )


def random_prompts(
    tok: AnyTokenizer,
    input_lens: list[int],
    output_lens: list[int],
    prefix: str,
    prefix_len: int,
    rng: np.random.Generator,
    cancelled: Callable[[], bool] | None = None,
) -> list[Prompt]:
    out = []
    for i, (n_in, n_out) in enumerate(zip(input_lens, output_lens, strict=True)):
        check_cancel(cancelled, i)
        out.append(Prompt(text_after(tok, prefix, n_in, rng), None, prefix_len + n_in, n_out))
    return out


def _stream(seed: int, k: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, k]))


def sampled_lengths(
    params: WorkloadParams, options: RandomOptions, n: int, rng: np.random.Generator
) -> tuple[list[int], list[int]]:
    """``n`` input and output lengths (each exactly the spec's when ``range_ratio`` is 0)."""
    r = options.range_ratio
    if r == 0:
        return [params.input_len] * n, [params.output_len] * n
    in_lo, in_hi = length_bounds(params.input_len, r)
    out_lo, out_hi = length_bounds(params.output_len, r, low_at_least=1)
    ins = rng.integers(in_lo, in_hi + 1, size=n).tolist()
    outs = rng.integers(out_lo, out_hi + 1, size=n).tolist()
    return ins, outs


class RandomDataset:
    name = "random"
    summary = "seeded random prompts of input_len tokens (range_ratio, shared prefix_len)"
    options: type[BaseModel] = RandomOptions
    timed = False

    def check(self, params: WorkloadParams, options: BaseModel) -> None:
        assert isinstance(options, RandomOptions)
        low, _ = length_bounds(params.input_len, options.range_ratio)
        if options.prefix_len + low < 1:
            raise ValueError(
                f"dataset_options.range_ratio: input_len {params.input_len} with range_ratio "
                f"{options.range_ratio:g} allows empty prompts; lower it or give prefix_len"
            )

    def prompt_tokens(self, params: WorkloadParams, options: BaseModel) -> int | None:
        assert isinstance(options, RandomOptions)
        _, high = length_bounds(params.input_len, options.range_ratio)
        return (params.prompts + params.warmup_requests) * (options.prefix_len + high)

    def build(self, params: WorkloadParams, options: BaseModel, ctx: BuildContext) -> Workload:
        assert isinstance(options, RandomOptions)
        p, tok, plen = params, ctx.tokenizer, options.prefix_len
        prefix = random_prompt_text(tok, plen, _stream(p.seed, 4)) if plen else ""
        ins, outs = sampled_lengths(p, options, p.prompts, _stream(p.seed, 3))
        measured = random_prompts(tok, ins, outs, prefix, plen, _stream(p.seed, 0), ctx.cancelled)
        w_prefix = random_prompt_text(tok, plen, _stream(p.seed, 6)) if plen else ""
        w_ins, w_outs = sampled_lengths(p, options, p.warmup_requests, _stream(p.seed, 5))
        warm = random_prompts(tok, w_ins, w_outs, w_prefix, plen, _stream(p.seed, 2), ctx.cancelled)
        return Workload(warm, measured)


RANDOM = RandomDataset()
