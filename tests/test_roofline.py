"""The Roofline's analytic model: SPEC worked example C exactly, hand-computed decoder
layers (GQA-aware, KV reads included), operating points and the knee."""

from __future__ import annotations

import pytest

from app.analysis import roofline as rl
from app.analysis.device_presets import DEVICE_PRESETS, device_preset, preset_for_device_name
from app.analysis.knee import efficiencies, find_knee
from app.analysis.model_presets import (
    MODEL_PRESETS,
    ModelConfig,
    dense_params,
    dtype_bytes,
    model_preset,
)

PEAK, BW = 100e12, 1e12


def test_spec_example_c_m1() -> None:
    c = rl.linear_cost(1, 4096, 16384, 2)
    assert c.flops == 134_217_728
    assert c.bytes == 134_258_688
    assert c.intensity == pytest.approx(1.0, abs=0.001)
    b = rl.lower_bound(c, PEAK, BW)
    assert b.limit == "memory"
    assert round(b.time_s * 1e3, 4) == 0.1343


def test_spec_example_c_m128() -> None:
    c = rl.linear_cost(128, 4096, 16384, 2)
    assert c.flops == 17_179_869_184
    assert c.bytes == 139_460_608
    assert round(c.intensity, 2) == 123.19
    b = rl.lower_bound(c, PEAK, BW)
    assert b.limit == "compute"
    assert round(b.time_s * 1e3, 4) == 0.1718


def test_machine_balance_and_roof() -> None:
    assert rl.machine_balance(PEAK, BW) == 100.0
    assert rl.attainable(1.0, PEAK, BW) == 1e12
    assert rl.attainable(1000.0, PEAK, BW) == PEAK
    with pytest.raises(ValueError):
        rl.machine_balance(0, BW)


def test_spec_decode_weight_reads() -> None:
    # a 7B fp16 model (14 GB) at 2 TB/s needs >= 7 ms a step; 13B (26 GB) >= 13 ms
    assert rl.lower_bound(rl.Cost(0, 14e9), PEAK, 2e12).time_s == pytest.approx(7e-3)
    assert rl.lower_bound(rl.Cost(0, 26e9), PEAK, 2e12).time_s == pytest.approx(13e-3)


TINY = ModelConfig(
    name="tiny",
    params=1000,
    layers=1,
    hidden=4,
    heads=2,
    kv_heads=1,
    head_dim=2,
    intermediate=8,
)
ONE = rl.Dtypes(weight=1, act=1, kv=1)


def test_decode_layer_by_hand() -> None:
    s = rl.step_cost(TINY, "decode", batch=1, tokens=1, context=3, dtypes=ONE)
    p = s.layer_parts
    assert (p["q_proj"].flops, p["q_proj"].bytes) == (32, 24)
    assert (p["k_proj"].flops, p["k_proj"].bytes) == (16, 14)
    # 4 (query, key) pairs x 4 x heads 2 x head_dim 2; Q+O 8 bytes, K and V of 4 positions 16
    assert (p["attention"].flops, p["attention"].bytes) == (64, 24)
    assert (p["down_proj"].flops, p["down_proj"].bytes) == (64, 44)
    assert (s.total.flops, s.total.bytes) == (352, 232)
    assert s.notes  # no vocab: logits left out, and said so


def test_prefill_attention_is_causal_and_gqa_aware() -> None:
    s = rl.step_cost(TINY, "prefill", batch=2, tokens=3, dtypes=ONE)
    # 3 tokens causal: 6 pairs per sequence; 2 sequences
    assert s.layer_parts["attention"].flops == 4 * 2 * 2 * 6 * 2
    assert s.layer_parts["attention"].bytes == (2 * 3 * 2 * 2 + 2 * 3 * 1 * 2) * 2
    mha = TINY.model_copy(update={"kv_heads": 2})
    d_gqa = rl.step_cost(TINY, "decode", batch=1, tokens=1, context=100, dtypes=ONE)
    d_mha = rl.step_cost(mha, "decode", batch=1, tokens=1, context=100, dtypes=ONE)
    # doubling KV heads doubles the KV read of 101 positions (2 x 101 x 2 bytes more)
    kv_diff = d_mha.layer_parts["attention"].bytes - d_gqa.layer_parts["attention"].bytes
    assert kv_diff == 2 * 101 * 2


def test_llama3_8b_decode_reads_its_weights() -> None:
    m = model_preset("llama-3-8b")
    s = rl.step_cost(m, "decode", batch=1, tokens=1, context=0)
    # every weight once, except the embedding table: only the batch's rows are read
    weights = 2 * (dense_params(m) - m.vocab * m.hidden)
    assert s.total.bytes == pytest.approx(weights, rel=0.01)
    assert s.total.intensity == pytest.approx(1.0, rel=0.05)
    # batch 64 at context 2048: KV reads add 64 x 2048 x 128 KiB
    s64 = rl.step_cost(m, "decode", batch=64, tokens=1, context=2048)
    assert s64.total.bytes - s.total.bytes > 64 * 2048 * 131072


def test_presets_match_their_parameter_counts() -> None:
    for m in MODEL_PRESETS.values():
        if m.attention == "gqa" and not m.is_moe:
            assert dense_params(m) == pytest.approx(m.params, rel=0.01), m.name


def test_mla_and_moe_are_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="MLA"):
        rl.step_cost(model_preset("deepseek-v3"), "decode", batch=1, tokens=1)
    with pytest.raises(ValueError, match="mixture of experts"):
        rl.step_cost(model_preset("mixtral-8x7b"), "decode", batch=1, tokens=1)


def test_operating_points() -> None:
    m = model_preset("llama-3-8b")
    h100 = device_preset("h100-sxm")
    d = rl.decode_point(
        m,
        concurrency=16,
        input_len=512,
        output_len=256,
        output_tok_s=800.0,
        peak_flops=h100.peak("bf16"),
        bandwidth_bps=h100.bandwidth_bps,
    )
    step = rl.step_cost(m, "decode", batch=16, tokens=1, context=640)
    assert d.time_s == pytest.approx(0.02)
    assert d.flops_s == pytest.approx(step.total.flops / 0.02)
    assert d.bytes_s == pytest.approx(step.total.bytes / 0.02)
    assert d.mbu == pytest.approx(d.bytes_s / 3.35e12)
    assert d.mfu is not None and d.mfu < 0.05
    p = rl.prefill_point(m, input_len=1024, ttft_s=0.1, peak_flops=1e15)
    assert p.flops_s == pytest.approx(
        rl.step_cost(m, "prefill", batch=1, tokens=1024).total.flops / 0.1
    )
    assert p.mbu is None and "lower bound" in p.explanation


def test_device_presets() -> None:
    assert set(DEVICE_PRESETS) >= {"h100-sxm", "h200", "a100-80gb", "l40s", "rtx-4090"}
    for d in DEVICE_PRESETS.values():
        assert d.source and d.flops["bf16"] > d.flops["fp32"]
    assert device_preset("H100-SXM").balance("bf16") == pytest.approx(989.4e12 / 3.35e12)
    assert preset_for_device_name("NVIDIA H100 80GB HBM3") is DEVICE_PRESETS["h100-sxm"]
    assert preset_for_device_name("NVIDIA H200") is DEVICE_PRESETS["h200"]
    assert preset_for_device_name("cpu") is None
    assert "fp8" not in device_preset("a100-80gb").flops
    with pytest.raises(ValueError, match="known"):
        device_preset("tpu")
    assert dtype_bytes("BF16") == 2 and dtype_bytes("int4") == 0.5


def test_knee() -> None:
    k = find_knee([1, 4, 8, 16, 32], [10, 39, 76, 90, 92], utilization=[20, 50, 93, 99, 99])
    assert k.batch == 8 and k.index == 2
    assert k.efficiencies[0] == pytest.approx(0.9667, abs=1e-4)
    assert "after batch 8" in k.explanation and "93%" in k.explanation
    still = find_knee([1, 2, 4], [10, 20, 39])
    assert still.batch is None and "no knee" in still.explanation
    assert find_knee([1], [5]).batch is None
    with pytest.raises(ValueError):
        efficiencies([1, 1], [1, 2])
