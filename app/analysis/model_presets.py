"""Model shapes for the roofline and the capacity planner, and presets from public configs.

Every preset copies the fields of the model's published Hugging Face ``config.json``
(``hidden_size``, ``intermediate_size``, ``num_hidden_layers``, ``num_attention_heads``,
``num_key_value_heads``, ``head_dim`` or ``hidden_size / num_attention_heads``,
``vocab_size``, ``tie_word_embeddings``; MLA: ``kv_lora_rank``, ``qk_rope_head_dim``) and the
parameter count from its model card. ``source`` names the repository each came from.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Attention = Literal["gqa", "mla"]

# bytes per element of the dtypes a user can name
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "tf32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}


def dtype_bytes(name: str) -> float:
    """Bytes per element of a dtype name (fp32, bf16, fp16, fp8, int8, int4)."""
    try:
        return DTYPE_BYTES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r} (known: {', '.join(DTYPE_BYTES)})") from None


class ModelConfig(BaseModel):
    """What the analytic model needs. ``attention="gqa"`` covers MHA (kv_heads = heads),
    GQA and MQA (kv_heads = 1); ``"mla"`` caches one latent of ``kv_lora_rank +
    qk_rope_head_dim`` per token and layer (DeepSeek-V2/V3). ``active_params`` < ``params``
    marks a mixture-of-experts model."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    params: int = Field(gt=0, description="total parameters")
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    intermediate: int = Field(0, ge=0, description="MLP width (gated MLP: 3 matrices)")
    vocab: int = Field(0, ge=0)
    tied_embeddings: bool = False
    attention: Attention = "gqa"
    kv_lora_rank: int | None = Field(None, gt=0)
    qk_rope_head_dim: int | None = Field(None, gt=0)
    active_params: int | None = Field(None, gt=0, description="MoE: parameters used per token")
    max_context: int | None = Field(None, gt=0)
    source: str | None = None

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.kv_heads > self.heads:
            raise ValueError("kv_heads cannot exceed heads")
        if self.attention == "gqa" and self.heads % self.kv_heads:
            raise ValueError("heads must be a multiple of kv_heads")
        if self.attention == "mla" and (self.kv_lora_rank is None or self.qk_rope_head_dim is None):
            raise ValueError("attention 'mla' needs kv_lora_rank and qk_rope_head_dim")
        return self

    @property
    def is_moe(self) -> bool:
        return self.active_params is not None and self.active_params < self.params


def _m(**kw: object) -> ModelConfig:
    return ModelConfig.model_validate(kw)


MODEL_PRESETS: dict[str, ModelConfig] = {
    m.name: m
    for m in (
        _m(
            name="llama-3-8b",
            params=8_030_261_248,
            layers=32,
            hidden=4096,
            heads=32,
            kv_heads=8,
            head_dim=128,
            intermediate=14336,
            vocab=128256,
            max_context=8192,
            source="meta-llama/Meta-Llama-3-8B config.json",
        ),
        _m(
            name="llama-3-70b",
            params=70_553_706_496,
            layers=80,
            hidden=8192,
            heads=64,
            kv_heads=8,
            head_dim=128,
            intermediate=28672,
            vocab=128256,
            max_context=8192,
            source="meta-llama/Meta-Llama-3-70B config.json",
        ),
        _m(
            name="llama-3.2-1b",
            params=1_235_814_400,
            layers=16,
            hidden=2048,
            heads=32,
            kv_heads=8,
            head_dim=64,
            intermediate=8192,
            vocab=128256,
            tied_embeddings=True,
            max_context=131072,
            source="meta-llama/Llama-3.2-1B config.json",
        ),
        _m(
            name="llama-2-7b",
            params=6_738_415_616,
            layers=32,
            hidden=4096,
            heads=32,
            kv_heads=32,
            head_dim=128,
            intermediate=11008,
            vocab=32000,
            max_context=4096,
            source="meta-llama/Llama-2-7b-hf config.json",
        ),
        _m(
            name="llama-2-13b",
            params=13_015_864_320,
            layers=40,
            hidden=5120,
            heads=40,
            kv_heads=40,
            head_dim=128,
            intermediate=13824,
            vocab=32000,
            max_context=4096,
            source="meta-llama/Llama-2-13b-hf config.json",
        ),
        _m(
            name="qwen2.5-7b",
            params=7_615_616_512,
            layers=28,
            hidden=3584,
            heads=28,
            kv_heads=4,
            head_dim=128,
            intermediate=18944,
            vocab=152064,
            max_context=32768,
            source="Qwen/Qwen2.5-7B-Instruct config.json",
        ),
        _m(
            name="qwen2.5-14b",
            params=14_770_033_664,
            layers=48,
            hidden=5120,
            heads=40,
            kv_heads=8,
            head_dim=128,
            intermediate=13824,
            vocab=152064,
            max_context=32768,
            source="Qwen/Qwen2.5-14B-Instruct config.json",
        ),
        _m(
            name="qwen2.5-72b",
            params=72_706_203_648,
            layers=80,
            hidden=8192,
            heads=64,
            kv_heads=8,
            head_dim=128,
            intermediate=29568,
            vocab=152064,
            max_context=32768,
            source="Qwen/Qwen2.5-72B-Instruct config.json",
        ),
        _m(
            name="mistral-7b",
            params=7_241_732_096,
            layers=32,
            hidden=4096,
            heads=32,
            kv_heads=8,
            head_dim=128,
            intermediate=14336,
            vocab=32000,
            max_context=32768,
            source="mistralai/Mistral-7B-v0.1 config.json",
        ),
        _m(
            name="mixtral-8x7b",
            params=46_702_792_704,
            active_params=12_879_925_248,
            layers=32,
            hidden=4096,
            heads=32,
            kv_heads=8,
            head_dim=128,
            intermediate=14336,
            vocab=32000,
            max_context=32768,
            source="mistralai/Mixtral-8x7B-v0.1 config.json (8 experts, 2 active)",
        ),
        _m(
            name="smollm2-135m",
            params=134_515_008,
            layers=30,
            hidden=576,
            heads=9,
            kv_heads=3,
            head_dim=64,
            intermediate=1536,
            vocab=49152,
            tied_embeddings=True,
            max_context=8192,
            source="HuggingFaceTB/SmolLM2-135M config.json",
        ),
        _m(
            name="deepseek-v2-lite",
            params=15_706_484_224,
            active_params=2_400_000_000,
            layers=27,
            hidden=2048,
            heads=16,
            kv_heads=16,
            head_dim=192,
            vocab=102400,
            attention="mla",
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            max_context=32768,
            source="deepseek-ai/DeepSeek-V2-Lite config.json (MLA; MoE, 2.4B active)",
        ),
        _m(
            name="deepseek-v3",
            params=671_000_000_000,
            active_params=37_000_000_000,
            layers=61,
            hidden=7168,
            heads=128,
            kv_heads=128,
            head_dim=192,
            vocab=129280,
            attention="mla",
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            max_context=163840,
            source="deepseek-ai/DeepSeek-V3 config.json (MLA; MoE, 37B active)",
        ),
    )
}


def model_preset(name: str) -> ModelConfig:
    try:
        return MODEL_PRESETS[name.lower()]
    except KeyError:
        known = ", ".join(MODEL_PRESETS)
        raise ValueError(f"unknown model preset {name!r} (known: {known})") from None


def dense_layer_params(m: ModelConfig) -> int:
    """Weights of one dense decoder layer: q, k, v, o projections, a gated MLP (gate, up,
    down) and two RMSNorm vectors (biases ignored)."""
    attn = m.hidden * m.heads * m.head_dim * 2 + 2 * m.hidden * m.kv_heads * m.head_dim
    mlp = 3 * m.hidden * m.intermediate
    return attn + mlp + 2 * m.hidden


def dense_params(m: ModelConfig) -> int:
    """Parameters implied by the shapes: layers, embeddings (twice unless tied), final norm."""
    emb = m.vocab * m.hidden * (1 if m.tied_embeddings else 2)
    return m.layers * dense_layer_params(m) + emb + m.hidden
