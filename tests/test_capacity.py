"""The capacity planner: SPEC section 4's examples, GQA and MLA, paged-block rounding."""

from __future__ import annotations

import pytest

from app.analysis import capacity as cap
from app.analysis.model_presets import ModelConfig, model_preset

GiB = 1024**3
KiB = 1024

# 32 layers, 8 KV heads, head_dim 128; 4 Gi parameters = 8 GiB of weights at 2 bytes
M = ModelConfig(
    name="m",
    params=4 * GiB,
    layers=32,
    hidden=4096,
    heads=32,
    kv_heads=8,
    head_dim=128,
    intermediate=14336,
)


def test_spec_kv_examples() -> None:
    per_tok = cap.kv_bytes_per_token(M, 2)
    assert per_tok == 128 * KiB
    assert per_tok * 8192 == 1 * GiB
    assert per_tok * 8192 * 16 == 16 * GiB
    assert cap.kv_bytes_per_token(model_preset("llama-3-8b"), 2) == 128 * KiB


def test_spec_weight_examples() -> None:
    assert cap.weights_bytes(70_000_000_000, 2) == 140e9
    assert cap.weights_bytes(70_000_000_000, 1) == 70e9
    assert cap.weights_bytes(70_000_000_000, 0.5) == 35e9


def test_gqa_mqa_mla() -> None:
    mha = M.model_copy(update={"kv_heads": 32})
    mqa = M.model_copy(update={"kv_heads": 1})
    assert cap.kv_bytes_per_token(mha, 2) == 4 * cap.kv_bytes_per_token(M, 2)
    assert cap.kv_bytes_per_token(mqa, 2) == cap.kv_bytes_per_token(M, 2) / 8
    # DeepSeek-V3: 61 layers x (512 + 64) latent x 2 bytes
    assert cap.kv_bytes_per_token(model_preset("deepseek-v3"), 2) == 61 * 576 * 2
    assert cap.kv_bytes_per_token(M, 1) == 64 * KiB  # fp8 KV cache halves it


def test_budget_concurrency_and_context() -> None:
    # 32 GiB x 0.75 = 24 GiB; - 8 GiB weights = 16 GiB KV = 131072 tokens = 8192 blocks
    p = cap.plan(M, device_memory_bytes=32 * GiB, utilization=0.75, context=8192, concurrency=16)
    assert p.kv_space_bytes == 16 * GiB
    assert p.num_blocks == 8192 and p.tokens_fit == 131072
    assert p.max_concurrency == 16
    assert p.max_context == 8192
    assert p.fits


def test_block_rounding_as_vllm() -> None:
    # 8193 tokens hold 513 blocks of 16: only 15 requests fit, not 15.998
    p = cap.plan(M, device_memory_bytes=32 * GiB, utilization=0.75, context=8193)
    assert p.max_concurrency == 15
    # at concurrency 3 each request gets 2730 whole blocks
    p3 = cap.plan(M, device_memory_bytes=32 * GiB, utilization=0.75, concurrency=3)
    assert p3.max_context == 2730 * 16
    # a reserve comes out of the KV space
    pr = cap.plan(
        M, device_memory_bytes=32 * GiB, utilization=0.75, reserve_bytes=8 * GiB, context=8192
    )
    assert pr.max_concurrency == 8


def test_does_not_fit() -> None:
    p = cap.plan(model_preset("llama-3-70b"), device_memory_bytes=80 * GiB, context=4096)
    assert not p.fits and p.num_blocks == 0 and p.max_concurrency == 0
    assert "does not fit" in p.notes[0]


def test_model_max_context_note() -> None:
    p = cap.plan(model_preset("llama-3-8b"), device_memory_bytes=80 * GiB, concurrency=1)
    assert p.max_context is not None and p.max_context > 8192
    assert any("maximum is 8192" in n for n in p.notes)


@pytest.mark.parametrize(
    "kw",
    [
        {"utilization": 0.0},
        {"utilization": 1.5},
        {"block_size": 0},
        {"context": 0},
        {"concurrency": 0},
        {"reserve_bytes": -1},
    ],
)
def test_bad_input(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        cap.plan(M, device_memory_bytes=GiB, **kw)  # type: ignore[arg-type]


def test_model_config_validation() -> None:
    with pytest.raises(ValueError):
        ModelConfig(name="x", params=1, layers=1, hidden=8, heads=4, kv_heads=3, head_dim=2)
    with pytest.raises(ValueError):
        ModelConfig(
            name="x", params=1, layers=1, hidden=8, heads=4, kv_heads=4, head_dim=2, attention="mla"
        )


# Hugging Face config.json as published (the fields the planner reads, trimmed)
LLAMA3_8B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
QWEN3_8B_CONFIG = {  # head_dim stated, not hidden / heads
    "hidden_size": 4096,
    "head_dim": 128,
    "intermediate_size": 12288,
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "vocab_size": 151936,
}
DEEPSEEK_V2_LITE_CONFIG = {
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_hidden_layers": 27,
    "num_key_value_heads": 16,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 64,
    "vocab_size": 102400,
    "max_position_embeddings": 163840,
}


def test_hf_config_gqa_kv_bytes_by_hand() -> None:
    m, notes = cap.model_from_hf_config(LLAMA3_8B_CONFIG)
    assert (m.layers, m.kv_heads, m.head_dim, m.attention) == (32, 8, 128, "gqa")
    # 2 (K, V) x 32 layers x 8 KV heads x 128 dims x 2 bytes = 131072 bytes per token
    assert cap.kv_bytes_per_token(m, 2) == 2 * 32 * 8 * 128 * 2 == 131072
    # the dense estimate reproduces the model card's 8,030,261,248 parameters exactly
    assert m.params == 8_030_261_248 and "estimated" in notes[0]
    assert m.max_context == 8192
    q, _ = cap.model_from_hf_config(QWEN3_8B_CONFIG, params=8_190_735_360)
    assert cap.kv_bytes_per_token(q, 2) == 2 * 36 * 8 * 128 * 2 == 147456
    assert cap.kv_bytes_per_token(q, 1) == 73728  # fp8 KV cache


def test_hf_config_mla_kv_bytes_by_hand() -> None:
    with pytest.raises(ValueError, match="parameter count"):
        cap.model_from_hf_config(DEEPSEEK_V2_LITE_CONFIG)  # MoE + MLA: not estimable
    m, _ = cap.model_from_hf_config(DEEPSEEK_V2_LITE_CONFIG, params=15_706_484_224)
    assert m.attention == "mla" and m.head_dim == 192
    # 27 layers x (512 latent + 64 rope) x 2 bytes = 31104 bytes per token
    assert cap.kv_bytes_per_token(m, 2) == 27 * (512 + 64) * 2 == 31104
    assert cap.kv_bytes_per_token(m, 2, tp=4) == 31104  # the latent is not split by heads
    assert cap.kv_bytes_per_token(m, 2) == cap.kv_bytes_per_token(
        model_preset("deepseek-v2-lite"), 2
    )


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        ({"hidden_size": 4096}, "num_hidden_layers"),
        (LLAMA3_8B_CONFIG | {"num_key_value_heads": 0}, "num_key_value_heads"),
        (LLAMA3_8B_CONFIG | {"num_key_value_heads": 64}, "kv_heads cannot exceed heads"),
        (LLAMA3_8B_CONFIG | {"hidden_size": "big"}, "hidden_size"),
        ([1, 2], "JSON object"),
    ],
)
def test_hf_config_errors_name_the_field(cfg: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        cap.model_from_hf_config(cfg)  # type: ignore[arg-type]


def test_tensor_parallel_splits_weights_and_kv_heads() -> None:
    m = model_preset("llama-3-70b")  # 80 layers, 8 KV heads, head_dim 128
    one = cap.kv_bytes_per_token(m, 2)
    assert one == 2 * 80 * 8 * 128 * 2
    assert cap.kv_bytes_per_token(m, 2, tp=2) == one / 2  # 4 heads per rank
    assert cap.kv_bytes_per_token(m, 2, tp=8) == one / 8  # 1 head per rank
    assert cap.kv_heads_per_rank(m, 16) == 1  # tp > KV heads: heads replicate
    assert cap.kv_bytes_per_token(m, 2, tp=16) == one / 8
    assert cap.tp_problem(model_preset("llama-2-7b"), 3) is not None  # 32 heads over 3
    p4 = cap.plan(m, device_memory_bytes=80 * GiB, tp=4, context=8192)
    assert p4.fits and p4.tp == 4
    assert p4.weights_bytes == m.params * 2 / 4
    assert p4.kv_space_bytes == pytest.approx(80 * GiB * 0.9 - m.params * 2 / 4)
    assert p4.num_blocks == int(p4.kv_space_bytes // (one / 4 * 16))
    p16 = cap.plan(m, device_memory_bytes=80 * GiB, tp=16)
    assert any("replicated" in n for n in p16.notes)


def test_70b_on_one_h100_says_it_does_not_fit_and_by_how_much() -> None:
    m = model_preset("llama-3-70b")
    p = cap.plan(m, device_memory_bytes=80 * GiB, context=4096)
    usable = 80 * GiB * 0.9
    assert not p.fits and p.shortfall_bytes == pytest.approx(m.params * 2 - usable)
    assert p.min_tp == 2
    assert f"by {(m.params * 2 - usable) / GiB:.1f} GiB" in p.notes[0]
    assert "at least 2 GPUs" in p.notes[0]
    assert cap.plan(m, device_memory_bytes=80 * GiB, tp=2, context=4096).fits
