"""ShareGPT multi-turn sessions under vLLM's length filters, turn by turn (built-in
tokenizer: one word, one token)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from app.client.datasets.base import BuildContext
from app.client.datasets.conversations import build_sessions
from app.client.datasets.sharegpt import ShareGPTOptions
from app.client.spec import RunSpec
from app.client.tokenizer import BuiltinTokenizer


def words(n: int, w: str = "w") -> str:
    return " ".join([w] * n)


def conv(*pairs: tuple[int, int | None], tag: str = "w") -> dict[str, Any]:
    """A conversation of (human words, gpt reply words or None: no reply) pairs."""
    out: list[dict[str, str]] = []
    for h, g in pairs:
        out.append({"from": "human", "value": words(h, tag)})
        if g is not None:
            out.append({"from": "gpt", "value": words(g, "r")})
    return {"conversations": out}


def build(tmp_path: Path, data: list[dict[str, Any]], n: int, seed: int = 0, **opts: Any) -> Any:
    p = tmp_path / "sg.json"
    p.write_text(json.dumps(data))
    spec = RunSpec(
        base_url="http://h:1",
        model="m",
        dataset="sharegpt",
        dataset_path=str(p),
        multi_turn=True,
        endpoint="chat",
        num_prompts=n,
        warmup_requests=0,
        output_len=9,
        seed=seed,
        dataset_options=opts,
    )
    options = ShareGPTOptions(**opts)
    ctx = BuildContext(BuiltinTokenizer())
    return build_sessions("sharegpt", spec.workload_params(), options, ctx, None)


def lengths(c: Any) -> list[tuple[int, int]]:
    return [(len(t.text.split()), t.output_len) for t in c.turns]


def test_each_turn_is_filtered_and_sessions_cut_at_the_first_failing_turn(
    tmp_path: Path,
) -> None:
    data = [
        conv((5, 6), (7, 8), (2, 9), (6, 6)),  # turn 3's text is under 4: cut after turn 2
        conv((3, 6), (5, 5)),  # turn 1 under 4 tokens: dropped
        conv((5, 2)),  # turn 1's reply under 4: dropped
        conv((5, 6), (1100, 5)),  # turn 2 over max_prompt_len 1024: one turn kept
        conv((1000, 6), (5, 1100)),  # turn 2: 5 + 1100 is within 2048: kept
        conv((1000, 1049)),  # 2049 over max_total_len: dropped
        conv((5, 6), (5, None)),  # no reply: the run's output_len (9), no minimum on it
    ]
    got = build(tmp_path, data, n=5)
    passed = [
        [(5, 6), (7, 8)],
        [(5, 6)],
        [(1000, 6), (5, 1100)],
        [(5, 6), (5, 9)],
    ]
    assert sorted(lengths(c) for c in got.measured[:4]) == sorted(passed)
    assert got.measured[4] == got.measured[0]  # 4 passed: the 5th session is the 1st again


def test_the_filters_are_the_runs_options(tmp_path: Path) -> None:
    data = [conv((3, 3), (2, 2))]
    with pytest.raises(ValueError, match="no conversation"):
        build(tmp_path, data, n=1)  # under vLLM's min_len 4: nothing passes
    got = build(tmp_path, data, n=1, min_len=2)
    assert lengths(got.measured[0]) == [(3, 3), (2, 2)]
    with pytest.raises(ValueError, match="no conversation"):
        build(tmp_path, data, n=1, min_len=2, max_total_len=5)  # turn 1: 3 + 3 = 6 tokens
    got = build(tmp_path, [conv((5, 2), (6, 1))], n=1, output_len=7)
    assert lengths(got.measured[0]) == [(5, 7), (6, 7)]  # a given output_len: no reply minimum


def test_sessions_are_drawn_seeded(tmp_path: Path) -> None:
    data = [conv((5, 5), (4 + i, 5), tag=f"c{i}") for i in range(20)]
    a = build(tmp_path, data, n=5, seed=3)
    b = build(tmp_path, data, n=5, seed=3)
    c = build(tmp_path, data, n=5, seed=4)
    tags = [s.turns[0].text.split()[0] for s in a.measured]
    assert tags == [s.turns[0].text.split()[0] for s in b.measured]
    assert tags != [s.turns[0].text.split()[0] for s in c.measured]
    order = list(range(20))
    random.Random(3).shuffle(order)  # vLLM's seeded shuffle, the order sessions are taken in
    assert tags == [f"c{i}" for i in order[:5]]
