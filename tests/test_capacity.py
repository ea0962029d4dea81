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
