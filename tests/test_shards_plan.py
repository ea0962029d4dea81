"""One schedule, dealt (issue 26 part 1): the plan is built once from the seed and dealt to N
load processes; the union of the shares is exactly the unsplit run's schedule, request by
request (its index, its body's bytes, its send time), for N = 1, 2, 3. Concurrency C is C
slots over the processes; a session stays on one process; a trace keeps its timestamps.
Checked against the one-process runner's own workload and schedule, built independently."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from app.client.shapes import schedule_for
from app.client.shards.plan import build_plan, deal, process_spec, resolve_processes, slot_shares
from app.client.spec import RunSpec
from app.client.tokenizer import BuiltinTokenizer
from app.client.workload import build_workload
from tests.api_support import SPEC

TOK = BuiltinTokenizer()


def _spec(**kw: Any) -> RunSpec:
    base: dict[str, Any] = {
        "base_url": "http://127.0.0.1:9",
        "model": "m",
        "num_prompts": 37,
        "input_len": 16,
        "output_len": 8,
        "seed": 11,
        "warmup_requests": 5,
    }
    return RunSpec(**(base | kw))


def _unsplit(spec: RunSpec) -> dict[int, tuple[bytes, int | None]]:
    """The one-process runner's requests: warm-ups 0..W-1 (no schedule), then measured."""
    w = build_workload(spec, TOK)
    kind, opts = spec.surface()
    params = spec.body_params()
    s = (
        spec
        if spec.num_prompts is not None
        else spec.model_copy(update={"num_prompts": len(w.measured)})
    )
    times = schedule_for(s, w.at_ns).times_ns.tolist()
    out: dict[int, tuple[bytes, int | None]] = {
        i: (kind.body(p, params, opts), None) for i, p in enumerate(w.warmup)
    }
    for j, (p, t) in enumerate(zip(w.measured, times, strict=True)):
        out[len(w.warmup) + j] = (kind.body(p, params, opts), int(t))
    return out


def _dealt(spec: RunSpec, n: int) -> dict[int, tuple[bytes, int | None]]:
    plan = build_plan(spec, n, TOK)
    kind, opts = spec.surface()
    params = spec.body_params()
    out: dict[int, tuple[bytes, int | None]] = {}
    for share in plan.shares:
        for i, p in zip(share.warmup_index, share.warmup, strict=True):
            assert i not in out
            out[i] = (kind.body(p, params, opts), None)
        for i, p, t in zip(share.index, share.measured, share.at_ns, strict=True):
            assert i not in out
            out[i] = (kind.body(p, params, opts), t)
    return out


@pytest.mark.parametrize(
    "shape",
    [
        {"request_rate": 50.0},
        {"request_rate": 20.0, "arrival": "gamma", "burstiness": 0.5, "max_concurrency": 7},
        {"max_concurrency": 5},
        {"ramp_up_strategy": "linear", "ramp_up_start_rps": 5, "ramp_up_end_rps": 50},
    ],
)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_same_seed_same_requests_and_offsets_for_any_n(shape: dict[str, Any], n: int) -> None:
    spec = _spec(**shape)
    assert _dealt(spec, n) == _unsplit(spec)


def test_trace_rows_keep_their_timestamps(tmp_path: Path) -> None:
    rows = [{"timestamp": 100 + 7 * k * k, "prompt": f"p {k} " * (k + 1)} for k in range(11)]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = RunSpec(
        base_url="http://h:1", model="m", dataset="timed_jsonl", dataset_path=str(path),
        output_len=4,
    )  # fmt: skip
    for n in (1, 2, 3):
        dealt = _dealt(spec, n)
        assert dealt == _unsplit(spec)
        # (ts - 100) ms by hand
        assert [dealt[k][1] for k in range(11)] == [7 * k * k * 1_000_000 for k in range(11)]


def test_concurrency_is_slots_dealt_over_processes() -> None:
    """C = 10 over 3 processes: slots 0..9 go to processes 0,1,2,0,1,2,0,1,2,0 (4, 3, 3);
    request i goes with slot i mod 10."""
    assert slot_shares(10, 3) == [4, 3, 3]
    assert slot_shares(2, 2) == [1, 1]
    assert deal(12, 3, 10).tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 0, 1]
    assert deal(5, 2, None).tolist() == [0, 1, 0, 1, 0]
    plan = build_plan(_spec(max_concurrency=10, warmup_requests=0, num_prompts=20), 3, TOK)
    assert [s.slots for s in plan.shares] == [4, 3, 3]
    # 20 requests: slots 0..9 twice -> 8, 6, 6
    assert [len(s.index) for s in plan.shares] == [8, 6, 6]
    assert plan.shares[0].index == [0, 3, 6, 9, 10, 13, 16, 19]
    child = process_spec(plan.spec, plan.shares[1])
    assert (child.max_concurrency, child.num_prompts, child.warmup_requests) == (3, 6, 0)
    assert child.processes == 1


def test_no_more_processes_than_slots_or_requests() -> None:
    plan = build_plan(_spec(max_concurrency=2), 4, TOK)
    assert plan.processes == 2 and plan.asked == 4
    assert "4 processes asked; 2 used (no more than concurrency 2)" in plan.notes
    plan = build_plan(_spec(num_prompts=2, warmup_requests=0), 3, TOK)
    assert plan.processes == 2
    assert "3 processes asked; 2 used (no more than 2 requests)" in plan.notes


def test_a_session_stays_on_one_process(tmp_path: Path) -> None:
    convs = [[f"s{s} turn {k}" for k in range(1 + s % 3)] for s in range(9)]
    path = tmp_path / "conv.jsonl"
    path.write_text("".join(json.dumps({"turns": c}) + "\n" for c in convs))
    spec = RunSpec(
        base_url="http://h:1", model="m", dataset="jsonl", dataset_path=str(path),
        multi_turn=True, num_prompts=7, max_concurrency=4, request_rate=30.0, seed=2,
        output_len=3,
    )  # fmt: skip
    one = build_plan(spec, 1, TOK).shares[0]
    assert one.conversations is not None
    want = {i: (c, t) for i, c, t in zip(range(7), one.conversations, one.at_ns, strict=True)}
    plan = build_plan(spec, 3, TOK)
    got: dict[int, Any] = {}
    for share in plan.shares:
        assert share.session_ids is not None and share.conversations is not None
        for s, c, t in zip(share.session_ids, share.conversations, share.at_ns, strict=True):
            assert s not in got  # on one process only, all its turns with it
            got[s] = (c, t)
    assert got == want
    assert plan.planned == sum(len(c.turns) for c, _ in want.values())
    # 4 slots over 3 processes (2, 1, 1); session s with slot s mod 4
    assert [s.session_ids for s in plan.shares] == [[0, 3, 4], [1, 5], [2, 6]]


def test_auto_is_the_cores_the_machine_can_spare(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(16)))
    assert resolve_processes("auto") == 15
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0})
    assert resolve_processes("auto") == 1
    assert resolve_processes(3) == 3


@pytest.mark.parametrize("value", [0, -1, 1.5, "x", "1.5", True, 1025, None])
def test_processes_refused_naming_the_field(value: Any) -> None:
    with pytest.raises(ValidationError) as e:
        RunSpec.model_validate(SPEC | {"processes": value})
    err = e.value.errors()[0]
    assert err["loc"][0] == "processes", err
    assert "processes" in err["msg"]


def test_processes_accepted() -> None:
    assert RunSpec.model_validate(SPEC | {"processes": "auto"}).processes == "auto"
    assert RunSpec.model_validate(SPEC | {"processes": "3"}).processes == 3
    assert RunSpec.model_validate(SPEC).processes == 1
