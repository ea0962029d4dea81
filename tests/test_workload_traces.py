"""Trace replay (mooncake, timed_jsonl): block prompts, the trace's schedule, its reuse ratio,
bad traces refused before anything is sent, and arrivals against the simulator."""

from __future__ import annotations

import asyncio
import json
import math
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from app.cli.args import Parser, UsageError, add_bench_arguments, spec_from_args
from app.client.datasets.base import WorkloadParams
from app.client.datasets.mooncake import (
    MOONCAKE,
    BlockPrompts,
    MooncakeOptions,
    prefix_reuse_ratio,
)
from app.client.execute import load_stats
from app.client.runner import run_load, run_load_sync
from app.client.shapes import schedule_for
from app.client.spec import RunSpec
from app.client.tokenizer import BuiltinTokenizer, HFTokenizer
from app.client.workload import build_workload
from app.domain import RequestStatus
from tests.test_datasets import hf_tokenizer  # noqa: F401  (the fixture)

TOK = BuiltinTokenizer()


def write_lines(path: Path, rows: list[dict[str, Any] | str]) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def trace_spec(path: str, **kw: Any) -> RunSpec:
    base: dict[str, Any] = {
        "base_url": "http://127.0.0.1:9",
        "model": "m",
        "dataset": "mooncake",
        "dataset_path": path,
        "num_prompts": 3,
    }
    base.update(kw)
    return RunSpec(**base)


ROWS: list[dict[str, Any] | str] = [
    {"timestamp": 0, "input_length": 10, "output_length": 3, "hash_ids": [7, 8, 9]},
    {"timestamp": 10, "input_length": 7, "output_length": 2, "hash_ids": [7, 5]},
    "",
    {"timestamp": 25.5, "input_length": 4, "output_length": 2, "hash_ids": [7]},
]


def test_equal_hash_ids_give_identical_token_blocks(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.jsonl", ROWS)
    spec = trace_spec(path, dataset_options={"block_size": 4})
    w = build_workload(spec, TOK)
    words = [p.prompt.split(" ") for p in w.measured if p.prompt is not None]
    # built-in tokenizer: one word one token, so lengths are exact
    assert [len(x) for x in words] == [10, 7, 4]
    assert [p.input_tokens for p in w.measured] == [10, 7, 4]
    assert [TOK.count(p.prompt or "") for p in w.measured] == [10, 7, 4]
    assert [p.output_len for p in w.measured] == [3, 2, 2]
    block7 = words[0][:4]
    assert words[1][:4] == block7 and words[2] == block7  # id 7 everywhere
    assert words[0][4:8] != words[1][4:7]  # ids 8 and 5 differ
    # the partial last block (10 = 4 + 4 + 2) is the first 2 tokens of id 9's block,
    # the same as a full id-9 block elsewhere
    full9 = build_workload(
        trace_spec(
            write_lines(
                tmp_path / "u.jsonl",
                [{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [9]}],
            ),
            num_prompts=1,
            dataset_options={"block_size": 4},
        ),
        TOK,
    ).measured[0]
    assert full9.prompt is not None and words[0][8:] == full9.prompt.split(" ")[:2]
    # the same seed gives the same blocks; another seed other ones
    again = build_workload(spec, TOK).measured
    assert [p.prompt for p in again] == [p.prompt for p in w.measured]
    other = build_workload(trace_spec(path, seed=1, dataset_options={"block_size": 4}), TOK)
    assert other.measured[0].prompt != w.measured[0].prompt


def test_schedule_and_reuse_ratio_from_the_trace(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.jsonl", ROWS)
    spec = trace_spec(path, dataset_options={"block_size": 4, "speedup": 2})
    w = build_workload(spec, TOK)
    # (timestamp - 0) ms / 2 in ns
    assert w.at_ns == [0, 5_000_000, 12_750_000]
    assert schedule_for(spec, w.at_ns).times_ns.tolist() == [0, 5_000_000, 12_750_000]
    # blocks 7 8 9 | 7 5 | 7: 6 blocks, 7 seen before twice: 2/6
    assert w.stats is not None and w.stats["prefix_reuse_ratio"] == pytest.approx(2 / 6)
    # default block 512: each request needs ceil(L / 512) = 1 block, ids 7, 7, 7: 2 of 3
    w512 = build_workload(trace_spec(path), TOK)
    assert w512.stats is not None and w512.stats["prefix_reuse_ratio"] == pytest.approx(2 / 3)
    assert prefix_reuse_ratio([]) is None


def test_warmups_never_share_a_measured_block(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.jsonl", ROWS)
    w = build_workload(trace_spec(path, warmup_requests=2, dataset_options={"block_size": 4}), TOK)
    measured = {p.prompt for p in w.measured}
    assert len(w.warmup) == 2 and [p.input_tokens for p in w.warmup] == [4, 7]
    assert all(p.prompt not in measured for p in w.warmup)
    assert w.warmup[0].prompt is not None and w.measured[2].prompt is not None
    assert w.warmup[0].prompt.split(" ")[:4] != w.measured[2].prompt.split(" ")[:4]


@pytest.mark.parametrize(
    "row,message",
    [
        (
            {"timestamp": 5, "input_length": 4, "output_length": 1, "hash_ids": [1]},
            "dataset_path line 3: 'timestamp' 5 is earlier than the previous line's 10",
        ),
        (
            {"timestamp": 20, "input_length": -4, "output_length": 1, "hash_ids": [1]},
            "dataset_path line 3: 'input_length' must be a positive integer, got -4",
        ),
        (
            {"timestamp": 20, "input_length": 4, "output_length": 0, "hash_ids": [1]},
            "dataset_path line 3: 'output_length' must be a positive integer, got 0",
        ),
        (
            {"timestamp": 20, "input_length": 9, "output_length": 1, "hash_ids": [1, 2]},
            "dataset_path line 3: 'hash_ids' has 2 ids, too few for input_length 9 "
            "(blocks of 4 tokens need 3)",
        ),
        (
            {"timestamp": 20, "input_length": 4, "output_length": 1, "hash_ids": ["a"]},
            "dataset_path line 3: 'hash_ids' must be a list of integers",
        ),
        (
            {"timestamp": -1, "input_length": 4, "output_length": 1, "hash_ids": [1]},
            "dataset_path line 3: 'timestamp' must be >= 0",
        ),
        ("{not json", "dataset_path line 3: not valid JSON"),
    ],
)
def test_a_bad_trace_line_is_named_and_nothing_is_sent(
    tmp_path: Path, row: dict[str, Any] | str, message: str
) -> None:
    rows: list[dict[str, Any] | str] = [
        {"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]},
        {"timestamp": 10, "input_length": 4, "output_length": 1, "hash_ids": [1]},
        row,
    ]
    path = write_lines(tmp_path / "bad.jsonl", rows)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    spec = trace_spec(path, base_url=f"http://127.0.0.1:{port}", dataset_options={"block_size": 4})
    try:
        with pytest.raises(ValueError) as e:
            asyncio.run(run_load(spec, run_tag="bad"))
        assert message in str(e.value)
        with pytest.raises(socket.timeout):
            listener.accept()  # no connection was made
    finally:
        listener.close()


def test_a_trace_shorter_than_num_prompts_is_refused(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.jsonl", ROWS)
    with pytest.raises(ValueError, match=r"num_prompts: 5 requested, the trace has 3 requests"):
        build_workload(trace_spec(path, num_prompts=5), TOK)


@pytest.mark.parametrize(
    "kw,field",
    [
        ({"request_rate": 10}, "request_rate"),
        ({"arrival": "constant"}, "arrival"),
        ({"burstiness": 2.0}, "burstiness"),
        (
            {"ramp_up_strategy": "linear", "ramp_up_start_rps": 1, "ramp_up_end_rps": 2},
            "ramp_up_strategy",
        ),
    ],
)
def test_a_load_shape_with_a_trace_is_refused(
    tmp_path: Path, kw: dict[str, Any], field: str
) -> None:
    path = write_lines(tmp_path / "t.jsonl", ROWS)
    with pytest.raises(ValidationError, match=rf"{field}: the dataset 'mooncake' gives each"):
        trace_spec(path, **kw)


def test_trace_flags_and_their_issue_aliases(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.jsonl", ROWS)
    p = Parser(prog="bench")
    add_bench_arguments(p)
    base = ["--base-url", "http://h:1", "--model", "m", "--dataset-name", "mooncake"]
    base += ["--dataset-path", path, "--num-prompts", "3"]
    for flags in (
        ["--trace-speedup", "2", "--trace-block-size", "256"],
        ["--mooncake-speedup", "2", "--mooncake-block-size", "256"],
    ):
        spec = spec_from_args(p.parse_args([*base, *flags]))
        assert spec.dataset_options == {"speedup": 2.0, "block_size": 256}
    with pytest.raises(UsageError, match=r"--request-rate: the dataset 'mooncake'"):
        spec_from_args(p.parse_args([*base, "--request-rate", "5"]))
    with pytest.raises(UsageError, match=r"--mooncake-speedup"):
        spec_from_args(p.parse_args([*base, "--trace-speedup", "0"]))


def test_timed_jsonl_schedule_and_bad_lines(tmp_path: Path) -> None:
    rows: list[dict[str, Any] | str] = [
        {"timestamp": 100, "prompt": "a b c"},
        {"timestamp": 100, "messages": [{"role": "user", "content": "x y"}], "output_len": 7},
        {"timestamp": 350, "prompt": "d"},
    ]
    path = write_lines(tmp_path / "timed.jsonl", rows)
    spec = RunSpec(
        base_url="http://h:1",
        model="m",
        dataset="timed_jsonl",
        dataset_path=path,
        num_prompts=3,
        output_len=4,
        dataset_options={"speedup": 4},
    )
    w = build_workload(spec, TOK)
    assert w.at_ns == [0, 0, 62_500_000]  # (ts - 100) ms / 4
    assert [p.input_tokens for p in w.measured] == [3, 2, 1]
    assert [p.output_len for p in w.measured] == [4, 7, 4]
    assert w.measured[1].messages == [{"role": "user", "content": "x y"}]
    bad = write_lines(tmp_path / "bad.jsonl", [rows[0], {"timestamp": 50, "prompt": "e"}])
    with pytest.raises(ValueError, match=r"dataset_path line 2: 'timestamp' 50 is earlier"):
        build_workload(spec.model_copy(update={"dataset_path": bad, "num_prompts": 2}), TOK)
    missing = write_lines(tmp_path / "nots.jsonl", [{"prompt": "e"}])
    with pytest.raises(ValueError, match=r"dataset_path line 1: 'timestamp' must be a number"):
        build_workload(spec.model_copy(update={"dataset_path": missing, "num_prompts": 1}), TOK)


def test_hash_block_options_are_checked() -> None:
    with pytest.raises(ValidationError):
        MooncakeOptions(block_size=0)
    no_path = WorkloadParams(1, 0, 1, 1, 0, None)
    with pytest.raises(ValueError, match="dataset_path is required"):
        MOONCAKE.check(no_path, MooncakeOptions())
    with pytest.raises(ValidationError, match="dataset_path is required"):
        RunSpec(base_url="http://h:1", model="m", dataset="timed_jsonl")


def test_trace_arrivals_against_the_simulator(tmp_path: Path) -> None:
    """Sent times follow the trace's timestamps / speedup: each record's schedule is exactly
    the trace time, its send within a bound of it (loose: a shared 2-core machine), and the
    simulator received the requests in the trace's order and spacing."""
    sim_mod = pytest.importorskip("app.targets.simulator")
    from app.targets.sim_config import SimConfig

    times_ms = [0, 40, 40, 100, 260, 300]
    rows: list[dict[str, Any] | str] = [
        {"timestamp": t, "input_length": 6, "output_length": 3, "hash_ids": [1, 2]}
        for t in times_ms
    ]
    path = write_lines(tmp_path / "t.jsonl", rows)
    handle = sim_mod.start_simulator_thread(SimConfig(ttft_ms=5.0, itl_ms=2.0, seed=1))
    try:
        spec = trace_spec(
            path,
            base_url=handle.base_url,
            num_prompts=len(times_ms),
            request_timeout_s=10.0,
            scrape_metrics=False,
            dataset_options={"block_size": 4, "speedup": 2},
        )
        res = run_load_sync(spec, run_tag="trace", handle_sigint=False)
        gt = handle.ground_truth()["requests"]
    finally:
        handle.stop()
    assert res.counts["ok"] == len(times_ms)
    expected_ns = [round(t * 1e6 / 2) for t in times_ms]
    recs = sorted(res.records, key=lambda r: r.index)
    assert [r.scheduled_ns - res.measure_start_ns for r in recs] == expected_ns
    late_ms = [((r.sent_ns or 0) - r.scheduled_ns) / 1e6 for r in recs]
    assert all(0 <= x < 50 for x in late_ms), late_ms
    received = [gt[f"trace-{r.index}"]["received_ns"] for r in recs]
    offsets = np.asarray(received) - received[0]
    assert np.all(np.abs(offsets / 1e6 - np.asarray(expected_ns) / 1e6) < 50)
    stats = load_stats(res)
    lat = stats["trace_lateness_ms"]
    ns = np.asarray([(r.sent_ns or 0) - r.scheduled_ns for r in recs], np.float64)
    assert lat["n"] == len(times_ms)
    assert lat["p50_ms"] == pytest.approx(np.median(ns) / 1e6)
    assert lat["max_ms"] == pytest.approx(ns.max() / 1e6)
    assert stats["send_lag_ms"]["n"] == len(times_ms)  # no request counted as a burst
    assert stats["workload"]["prefix_reuse_ratio"] == pytest.approx(10 / 12)
    assert all(r.status is RequestStatus.OK and r.input_tokens == 6 for r in recs)
    assert math.isclose(stats["workload"]["speedup"], 2.0)


def test_blocks_under_a_hugging_face_tokenizer(
    tmp_path: Path,
    hf_tokenizer: HFTokenizer,  # noqa: F811
) -> None:
    """Each id's block is the same text in every request; the recorded count is the joined
    text re-encoded (its own count, checked against the tokenizer directly)."""
    path = write_lines(tmp_path / "t.jsonl", ROWS)
    spec = trace_spec(path, dataset_options={"block_size": 4})
    w = build_workload(spec, hf_tokenizer)
    texts = [p.prompt or "" for p in w.measured]
    blocks = BlockPrompts(hf_tokenizer, 4, 0, 0)
    b7 = blocks.block_text(7, 4)
    assert texts[0].startswith(b7) and texts[1].startswith(b7) and texts[2] == b7
    assert texts[0] == b7 + blocks.block_text(8, 4) + blocks.block_text(9, 2)
    for p in w.measured:
        assert p.input_tokens == len(hf_tokenizer.encode(p.prompt or ""))


def test_a_replay_reuses_its_connection_and_never_sends_early(tmp_path: Path) -> None:
    """Each send waits on the loop's timer, then ends the wait in zero-timeout rounds taking
    the kept-alive connection ahead of the send: every request leaves at or after its trace
    time, all on the one connection (none taken ahead and lost); a stop during a wait ends
    the run with the requests due before it sent."""
    sim_mod = pytest.importorskip("app.targets.simulator")
    from app.targets.sim_config import SimConfig

    times_ms = [0, 15, 30, 45, 60, 90, 105, 120, 140, 160]  # each ends before the next
    rows: list[dict[str, Any] | str] = [
        {"timestamp": t, "prompt": f"p{i}", "output_len": 2} for i, t in enumerate(times_ms)
    ]
    path = write_lines(tmp_path / "t.jsonl", rows)
    handle = sim_mod.start_simulator_thread(SimConfig(ttft_ms=1.0, itl_ms=0.5, seed=1))
    try:
        spec = trace_spec(
            path,
            base_url=handle.base_url,
            dataset="timed_jsonl",
            num_prompts=len(times_ms),
            request_timeout_s=10.0,
            scrape_metrics=False,
        )
        res = run_load_sync(spec, run_tag="ka", handle_sigint=False)
        short = spec.model_copy(update={"max_duration_s": 0.5, "num_prompts": 2})
        rows2: list[dict[str, Any] | str] = [
            {"timestamp": 0, "prompt": "a", "output_len": 2},
            {"timestamp": 5000, "prompt": "b", "output_len": 2},  # never due: the run ends
        ]
        cut = run_load_sync(
            short.model_copy(update={"dataset_path": write_lines(tmp_path / "c.jsonl", rows2)}),
            run_tag="st",
            handle_sigint=False,
        )
    finally:
        handle.stop()
    recs = sorted(res.records, key=lambda r: r.index)
    assert [r.status for r in recs] == [RequestStatus.OK] * len(times_ms)
    assert all((r.sent_ns or 0) >= r.scheduled_ns for r in recs)
    assert res.connections["opened"] == 1 and res.connections["reused"] == len(times_ms) - 1
    assert cut.stopped == "max_duration" and cut.counts["sent"] == 1
    assert cut.end_ns < 2e9  # the 5 s wait was cut short


def test_a_connection_taken_ahead_goes_back_when_the_request_does_not_start() -> None:
    from app.client.clocks import ClockMap
    from app.client.connpool import Conn, ConnPool
    from app.client.http_request import parse_target
    from app.client.http_stream import StreamRequest

    pool = ConnPool(keep_alive=True, bound=4)
    a, b = socket.socketpair()
    try:
        # kept by where it is connected: the request's address
        conn = Conn(id=pool.new_id(), sock=a, family=socket.AF_UNIX, key=("127.0.0.1", 9))
        pool.give(conn)
        sr = StreamRequest(
            parse_target("http://127.0.0.1:9"), ("127.0.0.1", 9), socket.AF_INET,
            "/v1/completions", b"", [], request_id="r", timeout_s=1.0, clock=ClockMap(),
            pool=pool,
        )  # fmt: skip
        sr.reserve()
        assert pool.idle == 0
        sr.unreserve()
        assert pool.idle == 1 and pool.take() is None  # not a connection to another place
        assert pool.take(("127.0.0.1", 9)) is conn
    finally:
        a.close()
        b.close()
