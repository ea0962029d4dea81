"""Dataset type ``random``: seeded random prompts of an exact token length under the run's
tokenizer.

* built-in tokenizer: ``BuiltinTokenizer.random_text`` over seeded word indices (one word,
  one token, by construction);
* Hugging Face tokenizer: sample token ids, decode, re-encode, then trim or pad with more
  sampled ids and repeat until the re-encoded length is exact (as vLLM's random dataset
  does, but never accepting a near miss).

Measured prompts come from the seed's stream 0, warm-ups from stream 2: the measured
prompts do not depend on the warm-up count.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from pydantic import BaseModel

from app.client.datasets.base import (
    AnyTokenizer,
    BuildContext,
    NoOptions,
    Prompt,
    Workload,
    WorkloadParams,
    check_cancel,
)
from app.client.tokenizer import WORDS, BuiltinTokenizer, HFTokenizer


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


def random_prompts(
    tok: AnyTokenizer,
    n: int,
    input_len: int,
    output_len: int,
    rng: np.random.Generator,
    cancelled: Callable[[], bool] | None = None,
) -> list[Prompt]:
    out = []
    for i in range(n):
        check_cancel(cancelled, i)
        out.append(Prompt(random_prompt_text(tok, input_len, rng), None, input_len, output_len))
    return out


class RandomDataset:
    name = "random"
    summary = "seeded random prompts of exactly input_len tokens"
    options: type[BaseModel] = NoOptions

    def check(self, params: WorkloadParams, options: BaseModel) -> None:
        return None

    def prompt_tokens(self, params: WorkloadParams, options: BaseModel) -> int | None:
        return (params.num_prompts + params.warmup_requests) * params.input_len

    def build(self, params: WorkloadParams, options: BaseModel, ctx: BuildContext) -> Workload:
        p = params
        rng = np.random.default_rng(np.random.SeedSequence([p.seed, 0]))
        measured = random_prompts(
            ctx.tokenizer, p.num_prompts, p.input_len, p.output_len, rng, ctx.cancelled
        )
        wrng = np.random.default_rng(np.random.SeedSequence([p.seed, 2]))
        warm = random_prompts(
            ctx.tokenizer, p.warmup_requests, p.input_len, p.output_len, wrng, ctx.cancelled
        )
        return Workload(warm, measured)


RANDOM = RandomDataset()
