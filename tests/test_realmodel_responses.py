"""``transformers serve`` answering the Responses API (``/v1/responses``, streamed semantic
events) with SmolLM2-135M-Instruct on CPU (slow; skipped where the real-model extras are not
installed, as tests/test_realmodel.py's). Every stored figure must agree with the stored
events; tokens are the server's usage (``response.completed``'s ``output_tokens``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.client.spec import RunSpec
from app.services.runs import execute_bench, open_database
from tests.test_realmodel import _gguf, _need, check_consistent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # export + start: minutes under load


def test_transformers_serve_responses_api(tmp_path: Path) -> None:
    _need("torch", "transformers", "accelerate", "gguf", "openai", "fastapi", "uvicorn")
    gguf = _gguf()
    from app.targets.hf_serve import export_safetensors, start_transformers_serve

    model_dir = export_safetensors(gguf, tmp_path / "smollm2")
    sessions = open_database(f"sqlite:///{tmp_path / 'tserve.db'}")
    server = start_transformers_serve(model_dir)
    try:
        spec = RunSpec(
            base_url=server.base_url,
            model=str(model_dir),
            endpoint="responses",
            input_len=16,
            output_len=8,
            num_prompts=3,
            max_concurrency=1,
            request_timeout_s=120,
        )
        out = execute_bench(spec, sessions=sessions, name="transformers serve responses")
    finally:
        server.stop()
    assert out.run_id is not None and not out.failed, out.report["metrics"]["requests"]
    check_consistent(sessions, out.run_id, expect_tokens=None)
    assert out.report["metrics"]["ttfot_ms"]["count"] == 3  # output text: response.output_text
