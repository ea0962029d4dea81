"""Issue 24.8: the capacity planner takes only a tensor-parallel size vLLM would run.

vLLM's rule (``ModelConfig.verify_with_parallel_config`` and ``QKVParallelLinear``): the
attention heads split evenly over the ranks (``heads % tp == 0``); the KV heads split evenly
when there are more of them than ranks (``kv_heads % tp == 0``), else each is replicated on
``tp / kv_heads`` ranks (``tp % kv_heads == 0``). An MLA latent is not split by heads.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.analysis import capacity as cap
from app.analysis.model_presets import MODEL_PRESETS, ModelConfig, model_preset
from app.cli.main import main
from tests.api_support import Api, api_client

GiB = 1024**3


def vllm_accepts(heads: int, kv_heads: int, tp: int, mla: bool) -> bool:
    """vLLM's rule, written again here."""
    if heads % tp:
        return False
    if mla:
        return True
    return kv_heads % tp == 0 if tp < kv_heads else tp % kv_heads == 0


def custom(heads: int, kv_heads: int, params: int = 8 * 10**9) -> ModelConfig:
    return ModelConfig(
        name=f"h{heads}-kv{kv_heads}", params=params, layers=32, hidden=heads * 128,
        heads=heads, kv_heads=kv_heads, head_dim=128,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("heads", "kv_heads", "tp", "needle"),
    [
        # TP=3 on a 64-head model (Llama 3 70B): vLLM refuses it
        (64, 8, 3, "tp: 3 GPUs do not divide the model's 64 attention heads"),
        # 24 heads split over 6, but 4 KV heads cannot be replicated evenly on 6 ranks
        (24, 4, 6, "tp: 6 GPUs are not a multiple of the model's 4 KV heads"),
        # 24 heads over 8, and 12 KV heads do not split over 8 ranks
        (24, 12, 8, "tp: 8 GPUs do not divide the model's 12 KV heads"),
    ],
)
def test_a_tp_vllm_refuses_is_refused_naming_the_field(
    heads: int, kv_heads: int, tp: int, needle: str
) -> None:
    m = custom(heads, kv_heads)
    assert not vllm_accepts(heads, kv_heads, tp, mla=False)
    assert cap.tp_problem(m, tp) is not None and needle in str(cap.tp_problem(m, tp))
    with pytest.raises(ValueError, match=needle):
        cap.plan(m, device_memory_bytes=80 * GiB, tp=tp)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "tp", "per_rank"),
    [
        (64, 8, 16, 1),  # 8 KV heads, each on 2 of 16 ranks
        (64, 8, 4, 2),  # 8 KV heads split 2 per rank
        (9, 3, 3, 1),  # SmolLM2: 9 heads over 3, one KV head each
        (24, 4, 8, 1),  # 24 % 8 == 0 and 8 % 4 == 0: each KV head on 2 ranks
    ],
)
def test_a_tp_vllm_runs_is_planned(heads: int, kv_heads: int, tp: int, per_rank: int) -> None:
    m = custom(heads, kv_heads)
    assert vllm_accepts(heads, kv_heads, tp, mla=False) and cap.tp_problem(m, tp) is None
    p = cap.plan(m, device_memory_bytes=80 * GiB, tp=tp)
    assert p.kv_heads_per_rank == per_rank
    # 2 (K, V) x 32 layers x per-rank heads x 128 dims x 2 bytes
    assert p.kv_bytes_per_token == 2 * 32 * per_rank * 128 * 2


def test_every_preset_and_tp_as_vllm() -> None:
    for name in MODEL_PRESETS:
        m = model_preset(name)
        for tp in range(1, 65):
            ok = vllm_accepts(m.heads, m.kv_heads, tp, mla=m.attention == "mla")
            assert (cap.tp_problem(m, tp) is None) == ok, (name, tp)


def test_min_tp_is_a_tp_vllm_runs() -> None:
    """A 12-head model of 120 B parameters: 240e9 B of bf16 weights; 90% of an 80 GiB GPU
    is 77.31e9 B. Over 3 GPUs 80e9 B each: no; over 4, 60e9 B: yes -> 4."""
    m = custom(12, 12, params=120 * 10**9)
    p = cap.plan(m, device_memory_bytes=80 * GiB)
    assert not p.fits and p.min_tp == 4
    # 360 B parameters, 720e9 B: over 6 GPUs 120e9 B each does not fit; 8, 9, 10 and 11
    # do not divide 12 heads; over 12, 60e9 B fits -> 12
    big = custom(12, 12, params=360 * 10**9)
    assert cap.plan(big, device_memory_bytes=80 * GiB).min_tp == 12


@pytest.fixture
def api(db_url: str) -> Iterator[Api]:
    with api_client(db_url) as a:
        yield a


def test_api_and_page_refuse_a_bad_tp(api: Api) -> None:
    r = api.client.get("/api/v1/capacity", params={"model": "llama-3-70b", "tp": 3})
    assert r.status_code == 422
    err = r.json()["detail"][0]
    assert err["loc"][-1] == "tp" and "64 attention heads" in err["msg"]
    assert (
        api.client.get("/api/v1/capacity", params={"model": "llama-3-70b", "tp": 4}).status_code
        == 200
    )
    body = {"model": custom(24, 4).model_dump(mode="json"), "memory_gib": 80, "tp": 6}
    r = api.client.post("/api/v1/capacity", json=body, headers=api.h(api.run))
    assert r.status_code == 422 and "4 KV heads" in r.text and "tp" in r.text
    page = api.client.get("/capacity?model=llama-3-70b&tp=3")
    assert page.status_code == 422
    assert "3 GPUs do not divide the model&#39;s 64 attention heads" in page.text
    assert 'id="max-concurrency"' not in page.text


def test_cli_refuses_a_bad_tp(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "capacity", "--model", "llama-3-70b", "--tp", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "tp: 3 GPUs do not divide" in err and len(err.splitlines()) == 1
    assert main(["probe", "capacity", "--model", "llama-3-70b", "--tp", "4", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["tp"] == 4 and plan["kv_heads_per_rank"] == 2
