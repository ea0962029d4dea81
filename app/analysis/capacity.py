"""The capacity planner (SPEC section 4): weights, KV cache per token (GQA, MQA and MLA),
a paged cache in fixed-size blocks as vLLM allocates it, and the two questions: how many
concurrent requests of context L fit, and what context fits at concurrency C. Pure.

Budget (vLLM's), per GPU: ``device memory x utilization - weights / tp - runtime reserve``
is the KV space. vLLM cuts it into blocks of ``block_size`` tokens (``num_gpu_blocks = KV
space // (block_size x bytes per token per GPU)``) and a request holds ``ceil(tokens /
block_size)`` blocks on every rank.

Tensor parallelism over ``tp`` GPUs splits the weights and the KV heads, as vLLM does
(``tp_problem``: it refuses a tp that does not divide the attention heads, or that neither
divides the KV heads nor is a multiple of them): each rank holds ``kv_heads / tp`` KV heads,
or one when tp > kv_heads (each head replicated on tp / kv_heads ranks). An MLA latent is not
split by heads: every rank caches the whole latent.

``model_from_hf_config`` reads a pasted Hugging Face ``config.json`` (GQA fields
``num_key_value_heads`` / ``head_dim``; MLA fields ``kv_lora_rank`` / ``qk_rope_head_dim``
as DeepSeek uses them).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import ValidationError

from app.analysis.model_presets import ModelConfig

GiB = 1024**3


def weights_bytes(params: int, bytes_per_param: float) -> float:
    """Parameters x bytes per parameter (quantization metadata and buffers come on top)."""
    if params <= 0 or bytes_per_param <= 0:
        raise ValueError("params and bytes_per_param must be positive")
    return params * bytes_per_param


def tp_problem(m: ModelConfig, tp: int) -> str | None:
    """Why vLLM would refuse tensor parallelism over ``tp`` GPUs for ``m`` (None: it runs).

    vLLM (``ModelConfig.verify_with_parallel_config``, ``QKVParallelLinear``): the attention
    heads split evenly (``heads % tp == 0``); KV heads split evenly when there are more of
    them than ranks (``kv_heads % tp == 0``), else each is replicated on ``tp / kv_heads``
    ranks (``tp % kv_heads == 0``). An MLA latent has no KV heads to split."""
    if tp < 1:
        return f"tp: must be >= 1, got {tp}"
    if m.heads % tp:
        return (
            f"tp: {tp} GPUs do not divide the model's {m.heads} attention heads "
            "(vLLM needs heads % tp == 0)"
        )
    if m.attention == "mla":
        return None
    if tp < m.kv_heads and m.kv_heads % tp:
        return (
            f"tp: {tp} GPUs do not divide the model's {m.kv_heads} KV heads "
            "(vLLM needs kv_heads % tp == 0 when tp < kv_heads)"
        )
    if tp > m.kv_heads and tp % m.kv_heads:
        return (
            f"tp: {tp} GPUs are not a multiple of the model's {m.kv_heads} KV heads "
            "(vLLM replicates each KV head on tp / kv_heads ranks: tp % kv_heads == 0)"
        )
    return None


def kv_heads_per_rank(m: ModelConfig, tp: int = 1) -> int:
    """KV heads one of ``tp`` ranks caches: ``kv_heads / tp`` (``ceil`` for a tp vLLM would
    refuse, see ``tp_problem``), at least one (heads replicate when tp > kv_heads). MLA: not
    split (the whole latent on every rank)."""
    if tp < 1:
        raise ValueError("tp must be >= 1")
    if m.attention == "mla":
        return m.kv_heads
    return max(1, -(-m.kv_heads // tp))


def kv_bytes_per_token(m: ModelConfig, kv_bytes: float, tp: int = 1) -> float:
    """Bytes one token's KV cache takes on one GPU of ``tp``.

    GQA/MHA/MQA: 2 (K and V) x layers x kv_heads per rank x head_dim x bytes.
    MLA: one latent of kv_lora_rank + qk_rope_head_dim per layer x bytes, on every rank."""
    if kv_bytes <= 0:
        raise ValueError("kv_bytes must be positive")
    if m.attention == "mla":
        assert m.kv_lora_rank is not None and m.qk_rope_head_dim is not None
        return m.layers * (m.kv_lora_rank + m.qk_rope_head_dim) * kv_bytes
    return 2 * m.layers * kv_heads_per_rank(m, tp) * m.head_dim * kv_bytes


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks one request of ``tokens`` holds in a paged cache."""
    if tokens < 0 or block_size < 1:
        raise ValueError("tokens must be >= 0 and block_size >= 1")
    return -(-tokens // block_size)


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    model: str
    device_memory_bytes: float  # per GPU
    utilization: float
    tp: int  # GPUs the model is split over (tensor parallel)
    kv_heads_per_rank: int
    weights_bytes: float  # per GPU: the model's weights / tp
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
    shortfall_bytes: float  # per GPU, when it does not fit: weights + reserve - usable
    min_tp: int | None  # the smallest tp (<= 64, one vLLM runs) whose weights fit, if any
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
    tp: int = 1,
) -> CapacityPlan:
    """Answer "how many requests of ``context`` tokens fit" and/or "what context fits at
    ``concurrency``" for model ``m`` on ``tp`` GPUs of ``device_memory_bytes`` each."""
    problem = tp_problem(m, tp)
    if problem is not None:
        raise ValueError(problem)
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
    w = weights_bytes(m.params, weight_bytes) / tp
    per_tok = kv_bytes_per_token(m, kv_bytes, tp)
    usable = device_memory_bytes * utilization
    space = usable - w - reserve_bytes
    block = per_tok * block_size
    fits = space > 0
    min_tp = next(
        (
            t
            for t in range(1, 65)
            if tp_problem(m, t) is None and usable - m.params * weight_bytes / t > reserve_bytes
        ),
        None,
    )
    gpus = f" per GPU (tp={tp})" if tp > 1 else ""
    if not fits:
        hint = (
            f"; it needs tensor parallel over at least {min_tp} GPUs"
            if min_tp is not None and min_tp > tp
            else ""
        )
        notes.append(
            f"does not fit: weights {w / GiB:.1f} GiB{gpus} + reserve {reserve_bytes / GiB:.1f} "
            f"GiB exceed {utilization:.0%} of {device_memory_bytes / GiB:.1f} GiB by "
            f"{-space / GiB:.1f} GiB{hint}"
        )
    if m.attention != "mla" and tp > m.kv_heads:
        notes.append(
            f"tp={tp} exceeds the model's {m.kv_heads} KV heads: each rank caches one "
            "(heads are replicated), so KV per token does not shrink further"
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
        tp=tp,
        kv_heads_per_rank=kv_heads_per_rank(m, tp),
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
        shortfall_bytes=max(0.0, -space),
        min_tp=min_tp,
        notes=notes,
    )


# --------------------------------------------------------------------------- HF config.json

MOE_FIELDS = ("num_local_experts", "n_routed_experts", "num_experts")


def _int_field(cfg: dict[str, Any], key: str, *, required: bool = True) -> int | None:
    v = cfg.get(key)
    if v is None:
        if required:
            raise ValueError(f"config.json has no {key!r}")
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"config.json {key!r} must be a positive integer, not {v!r}")
    return v


def dense_params(
    *,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    intermediate: int,
    vocab: int,
    tied: bool,
) -> int:
    """Parameters of a dense decoder (Llama-style): embeddings (twice unless tied), per
    layer the Q, K, V, O projections, a gated MLP (3 matrices) and two norms."""
    attn = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    mlp = 3 * hidden * intermediate
    per_layer = attn + mlp + 2 * hidden
    return vocab * hidden * (1 if tied else 2) + layers * per_layer + hidden


def model_from_hf_config(
    cfg: dict[str, Any], *, name: str = "custom", params: int | None = None
) -> tuple[ModelConfig, list[str]]:
    """A ``ModelConfig`` from a Hugging Face ``config.json`` (dict), and notes on what was
    derived. ``params``: the parameter count (the model card's); estimated for a dense
    model without it; required for MoE and MLA models (their configs do not give it in a
    form this reads). Raises ``ValueError`` naming the field."""
    if not isinstance(cfg, dict):
        raise ValueError("config.json must be a JSON object")
    notes: list[str] = []
    layers = _int_field(cfg, "num_hidden_layers")
    hidden = _int_field(cfg, "hidden_size")
    heads = _int_field(cfg, "num_attention_heads")
    assert layers is not None and hidden is not None and heads is not None
    kv_heads = _int_field(cfg, "num_key_value_heads", required=False) or heads
    mla = cfg.get("kv_lora_rank") is not None
    kv_lora_rank = _int_field(cfg, "kv_lora_rank", required=False)
    rope = _int_field(cfg, "qk_rope_head_dim", required=mla)
    if mla:
        nope = _int_field(cfg, "qk_nope_head_dim", required=False) or 0
        head_dim = nope + (rope or 0)
    else:
        head_dim = _int_field(cfg, "head_dim", required=False) or hidden // heads
    intermediate = _int_field(cfg, "intermediate_size", required=False) or 0
    vocab = _int_field(cfg, "vocab_size", required=False) or 0
    tied = bool(cfg.get("tie_word_embeddings", False))
    moe = any(cfg.get(k) for k in MOE_FIELDS)
    if params is None:
        if moe or mla:
            kind = "a mixture-of-experts" if moe else "an MLA"
            raise ValueError(
                f"{kind} config: give the parameter count (from the model card); "
                "it cannot be estimated from config.json"
            )
        if not intermediate or not vocab:
            raise ValueError(
                "config.json lacks intermediate_size or vocab_size: give the parameter count"
            )
        params = dense_params(
            layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
            intermediate=intermediate, vocab=vocab, tied=tied,
        )  # fmt: skip
        notes.append(f"parameters estimated from config.json: {params / 1e9:.2f} B (dense)")
    try:
        model = ModelConfig(
            name=name,
            params=params,
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate=intermediate,
            vocab=vocab,
            tied_embeddings=tied,
            attention="mla" if mla else "gqa",
            kv_lora_rank=kv_lora_rank,
            qk_rope_head_dim=rope if mla else None,
            max_context=_int_field(cfg, "max_position_embeddings", required=False),
            source="pasted config.json",
        )
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first.get("loc") or ()) or "config.json"
        raise ValueError(f"{where}: {first.get('msg')}".replace("Value error, ", "")) from None
    return model, notes
