"""Dataset type ``prefix_repetition``: ``num_prefixes`` distinct random prefixes of
``prefix_len`` tokens; each request is one of them followed by its own random suffix of
``suffix_len`` tokens (``vllm bench serve --dataset-name prefix_repetition``, same
defaults: 256, 256, 10 prefixes, 128 output tokens).

Prompts are exactly prefix_len + suffix_len tokens under the run's tokenizer, the prefix's
own tokens first (``random.text_after``: no merge across the boundary), so a server's
prefix cache sees exactly ``num_prefixes`` shared prefixes. vLLM makes
``num_prompts // num_prefixes`` requests per prefix and drops the remainder; here request
k takes prefix k mod num_prefixes, so exactly ``num_prompts`` are built (per-prefix counts
differ by at most one), and then, as vLLM does, the order is shuffled (seeded). Warm-ups
have prefixes of their own (other seed streams), so they do not fill the prefix cache for
the measured requests.
"""

from __future__ import annotations

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
from app.client.datasets.random import random_prompt_text, text_after


class PrefixRepetitionOptions(BaseModel):
    model_config = {"extra": "forbid"}

    prefix_len: int = Field(256, ge=1, le=1_000_000, description="tokens of each prefix")
    suffix_len: int = Field(
        256, ge=1, le=1_000_000, description="tokens of each request's own suffix"
    )
    num_prefixes: int = Field(10, ge=1, le=1_000_000, description="distinct prefixes")
    output_len: int | None = Field(
        None, ge=1, le=1_000_000, description="output tokens per request (default: output_len)"
    )


def _stream(seed: int, k: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, k]))


def repeated_prefix_prompts(
    tok: AnyTokenizer,
    n: int,
    options: PrefixRepetitionOptions,
    output_len: int,
    rng: np.random.Generator,
    cancelled: Callable[[], bool] | None = None,
) -> list[Prompt]:
    """``n`` prompts over ``min(n, num_prefixes)`` prefixes, in a seeded shuffled order."""
    o = options
    prefixes = [random_prompt_text(tok, o.prefix_len, rng) for _ in range(min(n, o.num_prefixes))]
    total = o.prefix_len + o.suffix_len
    out = []
    for k in range(n):
        check_cancel(cancelled, k)
        text = text_after(tok, prefixes[k % len(prefixes)], o.suffix_len, rng)
        out.append(Prompt(text, None, total, output_len))
    order = rng.permutation(n).tolist()
    return [out[i] for i in order]


class PrefixRepetitionDataset:
    name = "prefix_repetition"
    summary = "num_prefixes shared prefixes of prefix_len tokens, each + a suffix_len suffix"
    options: type[BaseModel] = PrefixRepetitionOptions
    timed = False

    def check(self, params: WorkloadParams, options: BaseModel) -> None:
        assert isinstance(options, PrefixRepetitionOptions)
        if options.num_prefixes > params.prompts:
            raise ValueError(
                f"dataset_options.num_prefixes: {options.num_prefixes} prefixes need at "
                f"least as many prompts (num_prompts is {params.prompts})"
            )

    def prompt_tokens(self, params: WorkloadParams, options: BaseModel) -> int | None:
        assert isinstance(options, PrefixRepetitionOptions)
        per = options.prefix_len + options.suffix_len
        return (params.prompts + params.warmup_requests) * per

    def build(self, params: WorkloadParams, options: BaseModel, ctx: BuildContext) -> Workload:
        assert isinstance(options, PrefixRepetitionOptions)
        out_len = options.output_len or params.output_len
        tok, p = ctx.tokenizer, params
        measured = repeated_prefix_prompts(
            tok, p.prompts, options, out_len, _stream(p.seed, 0), ctx.cancelled
        )
        warm = repeated_prefix_prompts(
            tok, p.warmup_requests, options, out_len, _stream(p.seed, 2), ctx.cancelled
        )
        return Workload(warm, measured)


PREFIX_REPETITION = PrefixRepetitionDataset()
