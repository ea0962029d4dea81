"""Tool calls and images through the REST API and a worker (issue 25 parts 4-5): a worker
reads a JSONL's images only inside its dataset directories (one outside fails the job
naming the field, before anything is sent), sends a line's tools, and stores each request's
time to first tool call (``metric_values``); a ``random-mm`` run's prompt tokens are the
simulator's (text + ``image_tokens`` an image)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.client.datasets.images import noise_png
from app.client.tokenizer import BuiltinTokenizer
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread
from tests.live_server import LiveServerFactory
from tests.worker_helpers import api, start_worker_process, submit, wait_job

pytestmark = pytest.mark.slow

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {}}}


def test_a_worker_runs_tools_and_images_from_its_directories(
    live_server: LiveServerFactory, sqlite_url: str, tmp_path: Path
) -> None:
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir()
    outside.mkdir()
    (allowed / "a.png").write_bytes(noise_png(8, 8, np.random.default_rng(0)))
    (outside / "b.png").write_bytes(noise_png(8, 8, np.random.default_rng(1)))
    good = allowed / "good.jsonl"
    good.write_text(json.dumps({"prompt": "look this up", "tools": [TOOL],
                                "images": ["a.png"]}) + "\n")  # fmt: skip
    bad = allowed / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "x", "images": ["../outside/b.png"]}) + "\n")
    srv = live_server(sqlite_url)
    sim = start_simulator_thread(SimConfig(ttft_ms=2, itl_ms=0.2, image_tokens=50, seed=1))
    worker = start_worker_process(
        srv.url, srv.worker_token, tmp_path / "state", "--dataset-dir", str(allowed)
    )
    try:
        with api(srv) as c:
            small = {"base_url": sim.base_url, "model": "tokentrace-sim", "num_prompts": 3,
                     "output_len": 4, "scrape_metrics": False, "dataset": "jsonl"}  # fmt: skip
            run_ok, job_ok = submit(c, small | {"dataset_path": str(good)})
            _, job_bad = submit(c, small | {"dataset_path": str(bad)})
            run_mm, job_mm = submit(
                c,
                small | {"dataset": "random-mm", "input_len": 5,
                         "dataset_options": {"image_count": 2, "image_size": "16x16"}},
            )  # fmt: skip
            ends = ("succeeded", "failed", "cancelled")
            done, refused, mm = (wait_job(c, j, ends, 90) for j in (job_ok, job_bad, job_mm))
            rows = c.get(f"/runs/{run_ok}/requests", params={"limit": 10}).json()["items"]
            report = c.get(f"/runs/{run_ok}").json()
            mm_rows = c.get(f"/runs/{run_mm}/requests", params={"limit": 10}).json()["items"]
        truth = sim.ground_truth()["requests"]
    finally:
        worker.terminate()
        worker.wait(20)
        sim.stop()
    assert done["state"] == "succeeded", done
    assert refused["state"] == "failed", refused
    assert "'images'[0]: not an image file this worker may read" in refused["error"]
    assert mm["state"] == "succeeded", mm
    # the simulator saw 3 + 3 requests: none of the refused job's
    assert len(truth) == 6
    # prompt tokens: the line's text (3 words), its tools' JSON and one image; random-mm's
    # text (5) and two images
    good_tokens = 3 + BuiltinTokenizer().count(json.dumps([TOOL])) + 50
    assert sorted(g["input_tokens"] for g in truth.values()) == sorted(
        [good_tokens] * 3 + [5 + 2 * 50] * 3
    )
    assert len(rows) == 3 and len(mm_rows) == 3
    for r in rows:
        assert r["status"] == "ok"
        assert r["input_tokens"] == good_tokens  # the server's count, stored
    metrics = report["report"]["metrics"] if "report" in report else report["metrics"]
    assert metrics["ttftc_ms"]["count"] == 3
    assert metrics["ttftc_ms"]["p50"] == pytest.approx(metrics["ttft_ms"]["p50"], rel=1e-9)
    for r in mm_rows:
        assert r["input_tokens"] == 5 + 2 * 50
