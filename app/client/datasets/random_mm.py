"""Dataset type ``random-mm``: seeded random multimodal chat prompts, as ``vllm bench serve
--dataset-name random-mm`` builds them: each prompt is one user message of a random text of
exactly ``input_len`` tokens (``random``'s text) followed by ``image_count`` synthetic images
of ``image_size`` pixels (``images.noise_png``: seeded noise, every image distinct, as PNG
data URLs in ``image_url`` content parts).

The prompt tokens the client counts are the text's: an image's tokens are the server's to
count (``usage.prompt_tokens``); a run whose server reports none says its images are not
counted (a run note). It speaks chat messages: a surface that takes none (completions,
embeddings, rerank) is refused at launch, naming ``dataset`` and ``endpoint``.

Measured prompts' text comes from the seed's stream 0 and their images from stream 7;
warm-ups' from streams 2 and 8: the measured prompts do not depend on the warm-up count.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
from pydantic import BaseModel, Field, field_validator

from app.client.datasets.base import (
    AnyTokenizer,
    BuildContext,
    Prompt,
    Workload,
    WorkloadParams,
    check_cancel,
)
from app.client.datasets.images import (
    MAX_IMAGE_SIDE,
    MAX_IMAGES_PER_LINE,
    data_url,
    image_part,
    noise_png,
    noise_png_bytes_bound,
)
from app.client.datasets.random import random_prompt_text

MAX_IMAGE_BUDGET = 1 << 30  # a run's images built in memory (PNG bytes, warm-ups included)
_SIZE = re.compile(r"([0-9]{1,5})x([0-9]{1,5})")


def parse_size(text: str) -> tuple[int, int]:
    """``"512x512"`` -> (width, height), each 1 to ``MAX_IMAGE_SIDE``; else a ValueError."""
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        raise ValueError("must be WIDTHxHEIGHT in pixels, e.g. 512x512")
    w, h = int(m.group(1)), int(m.group(2))
    if not (1 <= w <= MAX_IMAGE_SIDE and 1 <= h <= MAX_IMAGE_SIDE):
        raise ValueError(f"width and height must be 1 to {MAX_IMAGE_SIDE} pixels ({text} given)")
    return w, h


class RandomMmOptions(BaseModel):
    model_config = {"extra": "forbid"}

    image_count: int = Field(
        1,
        ge=1,
        le=MAX_IMAGES_PER_LINE,
        description="synthetic images in each prompt (after its text)",
    )
    image_size: str = Field(
        "512x512",
        max_length=16,
        description=f"each image's WIDTHxHEIGHT in pixels (each side 1 to {MAX_IMAGE_SIDE})",
    )

    @field_validator("image_size")
    @classmethod
    def _size(cls, v: str) -> str:
        w, h = parse_size(v)
        return f"{w}x{h}"


def _stream(seed: int, k: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, k]))


def mm_prompts(
    tok: AnyTokenizer,
    n: int,
    params: WorkloadParams,
    options: RandomMmOptions,
    streams: tuple[int, int],
    cancelled: Callable[[], bool] | None = None,
) -> list[Prompt]:
    """``n`` prompts: text from the seed's stream ``streams[0]``, images from ``streams[1]``."""
    text_rng, image_rng = _stream(params.seed, streams[0]), _stream(params.seed, streams[1])
    w, h = parse_size(options.image_size)
    out = []
    for i in range(n):
        check_cancel(cancelled, i)
        text = random_prompt_text(tok, params.input_len, text_rng)
        parts = [
            image_part(data_url(noise_png(w, h, image_rng), "image/png"))
            for _ in range(options.image_count)
        ]
        content = [{"type": "text", "text": text}, *parts]
        msgs = [{"role": "user", "content": content}]
        out.append(Prompt(None, msgs, params.input_len, params.output_len, images=len(parts)))
    return out


class RandomMmDataset:
    name = "random-mm"
    summary = (
        "seeded random chat prompts of input_len tokens with image_count synthetic images of "
        "image_size (PNG); chat only"
    )
    options: type[BaseModel] = RandomMmOptions
    timed = False
    images = True  # its prompts are chat messages with images: chat surfaces only

    def check(self, params: WorkloadParams, options: BaseModel) -> None:
        assert isinstance(options, RandomMmOptions)
        if params.input_len < 1:
            raise ValueError("input_len: random-mm needs a text of 1 token at least")
        w, h = parse_size(options.image_size)
        n = (params.prompts + params.warmup_requests) * options.image_count
        total = n * noise_png_bytes_bound(w, h)
        if total > MAX_IMAGE_BUDGET:
            raise ValueError(
                f"num_prompts: {n:,} images of {options.image_size} (dataset_options."
                f"image_size) would hold ~{total >> 20:,} MiB, over the client's budget of "
                f"{MAX_IMAGE_BUDGET >> 20:,} MiB: fewer prompts, images or pixels"
            )

    def prompt_tokens(self, params: WorkloadParams, options: BaseModel) -> int | None:
        return (params.prompts + params.warmup_requests) * params.input_len

    def build(self, params: WorkloadParams, options: BaseModel, ctx: BuildContext) -> Workload:
        assert isinstance(options, RandomMmOptions)
        tok, p = ctx.tokenizer, params
        measured = mm_prompts(tok, p.prompts, p, options, (0, 7), ctx.cancelled)
        warm = mm_prompts(tok, p.warmup_requests, p, options, (2, 8), ctx.cancelled)
        return Workload(warm, measured, stats={"images": sum(x.images for x in measured)})


RANDOM_MM = RandomMmDataset()
