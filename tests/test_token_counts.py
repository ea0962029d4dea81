"""Issue 13.4: prompt tokens come from the server's usage where it reports them (a chat
template adds tokens the client's tokenizer never saw), and a disagreement is noted."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.client.spec import RunSpec
from app.domain import RequestStatus
from app.services.runs import execute_bench, open_database
from app.storage import repository as repo
from app.storage.db import session_scope
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread


@pytest.mark.parametrize("counting", ["auto", "tokenizer"])
def test_chat_prompt_tokens_from_server_usage(tmp_path: Path, counting: str) -> None:
    sessions = open_database(f"sqlite:///{tmp_path / 'tok.db'}")
    # the server's chat template adds 30 tokens to every 128-token prompt: usage says 158
    sim = start_simulator_thread(SimConfig(ttft_ms=2, itl_ms=1, chat_template_tokens=30, seed=1))
    try:
        spec = RunSpec(
            base_url=sim.base_url, model="tokentrace-sim", endpoint="chat", num_prompts=12,
            input_len=128, output_len=8, token_counting=counting, scrape_metrics=False,  # type: ignore[arg-type]
        )  # fmt: skip
        out = execute_bench(spec, sessions=sessions)
    finally:
        sim.stop()
    assert out.run_id is not None
    with session_scope(sessions) as s:
        recs = repo.load_records(s, out.run_id, include_warmup=False)
    ok = [r for r in recs if r.status is RequestStatus.OK]
    assert len(ok) == 12 and {r.usage_prompt_tokens for r in ok} == {158}
    m = out.report["metrics"]
    per_request = 158 if counting == "auto" else 128
    assert m["input_tokens_total"] == 12 * per_request
    assert {r.input_tokens for r in ok} == {per_request}  # what is stored per request
    # total-token throughput recomputed from the stored requests over the report's window
    first = min(r.sent_ns for r in recs if r.sent_ns is not None)
    last = max(max(r.end_ns or 0, int(r.event_t_ns.max(initial=0))) for r in recs)
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    want = (12 * per_request + out_tokens) / ((last - first) / 1e9)
    assert m["total_token_throughput_tok_s"] == pytest.approx(want, rel=1e-9)
    whose = "the server's" if counting == "auto" else "the client's"
    expect = (
        "prompt tokens: server usage 158 vs client tokenizer 128 on average "
        f"(12 of 12 requests differ); {whose} count is used"
    )
    assert expect in out.report["validity"]["notes"]
    counts = out.report["load"]["token_counts"]
    assert counts["usage_prompt_tokens"] == 12 * 158
    assert counts["tokenizer_prompt_tokens"] == 12 * 128
    assert counts["prompt_token_source"] == ("usage" if counting == "auto" else "tokenizer")


def test_agreeing_prompt_counts_are_not_noted(tmp_path: Path) -> None:
    sim = start_simulator_thread(SimConfig(ttft_ms=2, itl_ms=1, seed=1))
    try:
        spec = RunSpec(base_url=sim.base_url, model="tokentrace-sim", num_prompts=4,
                       input_len=64, output_len=4, scrape_metrics=False)  # fmt: skip
        out = execute_bench(spec, sessions=None)
    finally:
        sim.stop()
    assert out.report["metrics"]["input_tokens_total"] == 4 * 64
    assert not any("prompt tokens" in n for n in out.report["validity"]["notes"])
    assert out.report["load"]["token_counts"]["prompt_requests_disagreeing"] == 0
