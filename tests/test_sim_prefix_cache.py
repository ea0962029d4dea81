"""The simulator's prefix cache (``SimConfig.prefix_cache_block``): block hits by hand, then
multi-turn sessions against it, each turn's cached tokens checked against the previous
turn's prompt as the server counted it, and ``/metrics`` against the records' sums."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from app.client.runner import run_load_sync
from app.client.spec import RunSpec
from app.domain import RequestStatus
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread
from app.targets.simulator.prefix_cache import PrefixCache
from app.targets.simulator.surfaces import HANDLERS


def test_blocks_hit_only_with_everything_before_them() -> None:
    c = PrefixCache(block=4, capacity=100)
    a = list("abcdefghij")  # 10 tokens: blocks abcd, efgh (ij is partial: never cached)
    assert c.lookup(a, 10) == 0
    assert c.lookup(a, 10) == 8
    assert c.lookup([*"abcd", *"xyzw", *"ef"], 10) == 4  # first block only
    assert c.lookup([*"qqqq", *"efgh"], 8) == 0  # efgh after another block: a miss
    assert c.lookup(list("abcdefgh"), 6) == 6  # never more than the prompt's own count
    assert (c.queries, c.hits) == (44, 18)


def test_least_recently_used_blocks_go_first() -> None:
    c = PrefixCache(block=2, capacity=2)
    c.lookup(list("aabb"), 4)  # remembers [aa], [aa bb]
    c.lookup(list("cc"), 2)  # [cc] pushes out [aa], the oldest
    assert c.lookup(list("aabb"), 4) == 0
    assert c.lookup(list("cc"), 2) == 0  # pushed out again by the lookup just before


def test_a_forgotten_prefix_misses_then_is_remembered_again() -> None:
    c = PrefixCache(block=2, capacity=3)
    c.lookup(list("aabb"), 4)  # [aa], [aa bb]
    c.lookup(list("cc"), 2)  # [cc]
    c.lookup(list("dd"), 2)  # [dd] pushes out [aa], the oldest
    assert c.lookup(list("aabb"), 4) == 0  # [aa] missed: nothing after it counts
    assert c.lookup(list("aabb"), 4) == 4  # both remembered again


def test_chat_tokens_mark_each_role() -> None:
    body = {"messages": [{"role": "user", "content": "hi there"}, {"role": "assistant",
            "content": [{"type": "text", "text": "yo"}]}]}  # fmt: skip
    chat = ["<|user|>", "hi", " there", "<|assistant|>", "yo"]
    assert HANDLERS["chat"].prompt_tokens(body) == chat
    assert HANDLERS["completions"].prompt_tokens({"prompt": [1, 2]}) == ["1", "2"]


def test_config_bounds() -> None:
    with pytest.raises(ValueError, match="prefix_cache_block"):
        SimConfig(prefix_cache_block=-1)
    with pytest.raises(ValueError, match="prefix_cache_blocks"):
        SimConfig(prefix_cache_block=16, prefix_cache_blocks=0)


def test_multi_turn_sessions_hit_the_previous_turns_prompt(tmp_path: Path) -> None:
    block, ttft_ms, per_token_ms = 16, 5.0, 0.05
    words = " ".join(f"w{i}" for i in range(30))
    path = tmp_path / "conv.jsonl"
    convs = [[f"s{s} t{k} {words}" for k in range(3)] for s in range(3)]
    path.write_text("".join(json.dumps({"turns": c}) + "\n" for c in convs))
    cfg = SimConfig(
        ttft_ms=ttft_ms, itl_ms=1, per_input_token_ms=per_token_ms, seed=2,
        prefix_cache_block=block,
    )  # fmt: skip
    sim = start_simulator_thread(cfg)
    try:
        spec = RunSpec(
            base_url=sim.base_url, model="sim", dataset="jsonl", dataset_path=str(path),
            multi_turn=True, num_prompts=3, output_len=12, scrape_metrics=False,
            request_timeout_s=10,
        )  # fmt: skip
        res = run_load_sync(spec, run_tag="pc", handle_sigint=False)
        metrics = httpx.get(f"{sim.base_url}/metrics").text
    finally:
        sim.stop()
    recs = [r for r in res.records if not r.warmup]
    assert len(recs) == 9 and all(r.status is RequestStatus.OK for r in recs)
    by = {(r.session, r.turn): r for r in recs}
    for s in range(3):
        assert by[(s, 1)].cached_prompt_tokens == 0  # sessions differ from their first word
        for k in (2, 3):
            prev, cur = by[(s, k - 1)], by[(s, k)]
            assert prev.usage_prompt_tokens is not None and cur.usage_prompt_tokens is not None
            # the previous turn's prompt (its 2k-3 messages, a role marker each) in full
            # blocks: all cached, as this turn's prompt begins with exactly that
            seen = prev.usage_prompt_tokens + (2 * (k - 1) - 1)
            assert cur.cached_prompt_tokens == seen // block * block, (s, k)
            # the simulator charges prefill for the uncached tokens only
            assert cur.sent_ns is not None
            first = int(cur.event_t_ns[cur.event_tokens > 0][0])  # the first token's stamp
            uncached = cur.usage_prompt_tokens - cur.cached_prompt_tokens
            assert first - cur.sent_ns >= (ttft_ms + per_token_ms * uncached) * 1e6 * 0.99
    queries = sum(r.usage_prompt_tokens or 0 for r in res.records)
    hits = sum(r.cached_prompt_tokens or 0 for r in res.records)
    assert hits > 0
    assert f'vllm:prefix_cache_queries_total{{model_name="tokentrace-sim"}} {queries}' in metrics
    assert f'vllm:prefix_cache_hits_total{{model_name="tokentrace-sim"}} {hits}' in metrics
