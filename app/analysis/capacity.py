"""The capacity planner (SPEC section 4): weights, KV cache per token (GQA, MQA and MLA),
a paged cache in fixed-size blocks as vLLM allocates it, and the two questions: how many
concurrent requests of context L fit, and what context fits at concurrency C. Pure.

Budget (vLLM's): ``device memory x utilization - weights - runtime reserve`` is the KV
space. vLLM cuts it into blocks of ``block_size`` tokens (``num_gpu_blocks = KV space //
(block_size x bytes per token)``) and a request holds ``ceil(tokens / block_size)`` blocks.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from app.analysis.model_presets import ModelConfig

GiB = 1024**3


def weights_bytes(params: int, bytes_per_param: float) -> float:
    """Parameters x bytes per parameter (quantization metadata and buffers come on top)."""
    if params <= 0 or bytes_per_param <= 0:
        raise ValueError("params and bytes_per_param must be positive")
    return params * bytes_per_param


def kv_bytes_per_token(m: ModelConfig, kv_bytes: float) -> float:
    """GQA/MHA/MQA: 2 (K and V) x layers x kv_heads x head_dim x bytes.
    MLA: one latent of kv_lora_rank + qk_rope_head_dim per layer x bytes."""
    if kv_bytes <= 0:
        raise ValueError("kv_bytes must be positive")
    if m.attention == "mla":
        assert m.kv_lora_rank is not None and m.qk_rope_head_dim is not None
        return m.layers * (m.kv_lora_rank + m.qk_rope_head_dim) * kv_bytes
    return 2 * m.layers * m.kv_heads * m.head_dim * kv_bytes


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks one request of ``tokens`` holds in a paged cache."""
    if tokens < 0 or block_size < 1:
        raise ValueError("tokens must be >= 0 and block_size >= 1")
    return -(-tokens // block_size)


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    model: str
    device_memory_bytes: float
    utilization: float
    weights_bytes: float
    reserve_bytes: float
    kv_space_bytes: float
    kv_bytes_per_token: float
    block_size: int
    block_bytes: float
    num_blocks: int
    tokens_fit: int  # num_blocks x block_size
    context: int | None
    max_concurrency: int | None  # requests of `context` tokens that fit at once
    concurrency: int | None
    max_context: int | None  # tokens per request that fit at `concurrency`
    fits: bool
    notes: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan(
    m: ModelConfig,
    *,
    device_memory_bytes: float,
    weight_bytes: float = 2.0,
    kv_bytes: float = 2.0,
    utilization: float = 0.9,
    reserve_bytes: float = 0.0,
    block_size: int = 16,
    context: int | None = None,
    concurrency: int | None = None,
) -> CapacityPlan:
    """Answer "how many requests of ``context`` tokens fit" and/or "what context fits at
    ``concurrency``" for model ``m`` on a device of ``device_memory_bytes``."""
    if device_memory_bytes <= 0:
        raise ValueError("device_memory_bytes must be positive")
    if not 0 < utilization <= 1:
        raise ValueError("utilization must be in (0, 1]")
    if reserve_bytes < 0:
        raise ValueError("reserve_bytes must be >= 0")
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    if context is not None and context < 1:
        raise ValueError("context must be >= 1")
    if concurrency is not None and concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    notes: list[str] = []
    w = weights_bytes(m.params, weight_bytes)
    per_tok = kv_bytes_per_token(m, kv_bytes)
    space = device_memory_bytes * utilization - w - reserve_bytes
    block = per_tok * block_size
    fits = space > 0
    if not fits:
        notes.append(
            f"does not fit: weights {w / GiB:.1f} GiB + reserve {reserve_bytes / GiB:.1f} GiB "
            f"exceed {utilization:.0%} of {device_memory_bytes / GiB:.1f} GiB"
        )
    num_blocks = max(0, math.floor(space / block)) if fits else 0
    max_conc = None
    if context is not None:
        need = blocks_for(context, block_size)
        max_conc = num_blocks // need
        if m.max_context is not None and context > m.max_context:
            notes.append(f"context {context} exceeds the model's maximum {m.max_context}")
        if fits and max_conc == 0:
            notes.append(f"not even one request of {context} tokens fits")
    max_ctx = None
    if concurrency is not None:
        max_ctx = (num_blocks // concurrency) * block_size
        if m.max_context is not None and max_ctx > m.max_context:
            notes.append(
                f"memory allows {max_ctx} tokens per request; the model's maximum is "
                f"{m.max_context}"
            )
    notes.append(
        "real use is higher: quantization metadata, activations, CUDA graphs and "
        "fragmentation belong in the reserve"
    )
    return CapacityPlan(
        model=m.name,
        device_memory_bytes=device_memory_bytes,
        utilization=utilization,
        weights_bytes=w,
        reserve_bytes=reserve_bytes,
        kv_space_bytes=max(0.0, space),
        kv_bytes_per_token=per_tok,
        block_size=block_size,
        block_bytes=block,
        num_blocks=num_blocks,
        tokens_fit=num_blocks * block_size,
        context=context,
        max_concurrency=max_conc,
        concurrency=concurrency,
        max_context=max_ctx,
        fits=fits,
        notes=notes,
    )
