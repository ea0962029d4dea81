"""Issue 13.5: the server's own prefill and decode time from its counters (llama.cpp's
seconds counters, vLLM's prefill/decode histograms), a last scrape after the last request,
and the figures beside the client's TTFT/ITL in the report and the CLI."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from app.analysis.server_timing import server_timing
from app.client.metrics_scraper import MetricsScraper
from app.protocol.prometheus import Series, add_scrape, parse_text, select, wanted
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread

FIXTURE = Path(__file__).parent / "fixtures" / "shared" / "llamacpp-metrics-during-load.prom"
LLAMA = FIXTURE.read_text()  # prompt_seconds_total 0.122422, tokens_predicted_* 0


def _later(prompt_s: float, predicted: int, predicted_s: float) -> str:
    """The fixture with the three counters moved on, as a later scrape would show them."""
    text = LLAMA
    for name, old, new in (
        ("prompt_seconds_total", "0.122422", prompt_s),
        ("tokens_predicted_total", "0", predicted),
        ("tokens_predicted_seconds_total", "0", predicted_s),
    ):
        text = text.replace(f"llamacpp:{name} {old}\n", f"llamacpp:{name} {new}\n")
    return text


def _series(*texts: str) -> list[Series]:
    acc: dict[tuple[str, tuple[tuple[str, str], ...]], Series] = {}
    for i, text in enumerate(texts):
        samples, kinds = parse_text(text)
        add_scrape(acc, i * 1_000_000_000, select(samples, wanted()), kinds)
    return list(acc.values())


def test_llamacpp_counters_are_kept_and_give_prefill_and_decode() -> None:
    series = _series(LLAMA, _later(0.922422, 400, 2.0))
    names = {s.name for s in series}
    assert {"llamacpp:prompt_seconds_total", "llamacpp:tokens_predicted_seconds_total"} <= names
    t = server_timing(series, requests=40)
    assert t is not None and t["source"] == "llamacpp"
    # hand: (0.922422 - 0.122422) s / 40 requests = 0.02 s. llama.cpp's generation clock
    # starts at each request's first token, so 2.0 s covers 400 - 40 = 360 decode steps:
    # 2.0 / 360 = 0.0055556 s (not 2.0 / 400 = 0.005, 10% low)
    assert t["prefill_s_per_request"] == pytest.approx(0.02)
    assert t["decode_s_per_token"] == pytest.approx(0.0055556, abs=1e-7)
    assert server_timing(_series(LLAMA), requests=40) is None  # one scrape: no increase
    assert server_timing(series, requests=0)["prefill_s_per_request"] is None  # type: ignore[index]


VLLM = """# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_bucket{{le="0.1",model_name="m"}} {n}
vllm:request_prefill_time_seconds_sum{{model_name="m"}} {pre}
vllm:request_prefill_time_seconds_count{{model_name="m"}} {n}
# TYPE vllm:request_decode_time_seconds histogram
vllm:request_decode_time_seconds_sum{{model_name="m"}} {dec}
vllm:request_decode_time_seconds_count{{model_name="m"}} {n}
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{{model_name="m"}} {gen}
"""


def test_vllm_histograms_give_prefill_and_decode() -> None:
    series = _series(
        VLLM.format(n=5, pre=0.25, dec=1.0, gen=5 * 64),
        VLLM.format(n=25, pre=1.45, dec=13.6, gen=25 * 64),
    )
    kinds = {s.name: s.kind for s in series}
    assert kinds["vllm:request_prefill_time_seconds_sum"] == "histogram"
    t = server_timing(series, requests=999)  # vLLM counts its own requests
    assert t is not None and t["source"] == "vllm"
    # hand: prefill (1.45 - 0.25) / (25 - 5) = 0.06 s; decode (13.6 - 1.0) s over
    # (20 x 64 tokens - 20 first tokens) = 12.6 / 1260 = 0.01 s
    assert t["prefill_s_per_request"] == pytest.approx(0.06)
    assert t["decode_s_per_token"] == pytest.approx(0.01)


class _Metrics:
    """A loopback /metrics: the fixture on the first scrape, ``later`` after it."""

    def __init__(self, later: str) -> None:
        self.later = later
        self.scrapes = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = (LLAMA if owner.scrapes == 0 else owner.later).encode()
                owner.scrapes += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def metrics() -> Iterator[_Metrics]:
    m = _Metrics(_later(0.122422 + 0.02 * 12, 12 * 8, 12 * 8 * 0.0015))
    try:
        yield m
    finally:
        m.close()


def test_scraper_takes_a_last_scrape_when_asked(metrics: _Metrics) -> None:
    import time

    quiet = MetricsScraper(metrics.url, wanted(), period_s=60.0).start()
    deadline = time.monotonic() + 5
    while metrics.scrapes < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    res = quiet.stop()  # no last scrape: the counters' last wave is lost
    (prompt,) = [s for s in res.series if s.name == "llamacpp:prompt_seconds_total"]
    assert prompt.values == [0.122422] and metrics.scrapes == 1
    final = MetricsScraper(metrics.url, wanted(), period_s=60.0).start()
    res = final.stop(final_scrape=True)
    (prompt,) = [s for s in res.series if s.name == "llamacpp:prompt_seconds_total"]
    assert len(prompt.values) in (1, 2) and prompt.values[-1] == pytest.approx(0.362422)
    assert res.scrapes == len(prompt.values)


def test_run_reports_server_timing_beside_the_client(
    metrics: _Metrics, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """12 requests (2 warm-ups) of 8 tokens in well under the 1 s scrape period: only the
    first scrape and the last one after the run; the fake server's counters rose by
    0.24 s of prompts and 96 tokens in 0.144 s: 20 ms per request; 0.144 s over 96 - 12 = 84
    decode steps (each request's first token came out of its prefill) = 1.7142857 ms."""
    from app.cli.main import main
    from app.services.runs import open_database, run_report

    sim = start_simulator_thread(SimConfig(ttft_ms=5, itl_ms=1, seed=2))
    db = f"sqlite:///{tmp_path / 'srv.db'}"
    try:
        args = [
            "bench", "--base-url", sim.base_url, "--model", "tokentrace-sim",
            "--num-prompts", "10", "--num-warmups", "2", "--input-len", "8", "--output-len", "8",
            "--metrics-url", metrics.url, "--database-url", db,
        ]  # fmt: skip
        assert main([*args, "--json"]) == 0
    finally:
        sim.stop()
    rep = json.loads(capsys.readouterr().out)
    assert metrics.scrapes >= 2
    t = rep["server_timing"]
    assert t["source"] == "llamacpp"
    assert t["server_prefill_ms_per_request"] == pytest.approx(20.0)
    assert t["server_decode_ms_per_token"] == pytest.approx(1.7142857)
    assert t["client_ttft_ms_mean"] == pytest.approx(rep["metrics"]["ttft_ms"]["mean"])
    assert t["client_itl_ms_mean"] == pytest.approx(rep["metrics"]["itl_ms"]["mean"])
    timing = rep["load"]["server_metrics"]["timing"]
    assert timing["requests"] == 12 and timing["generated_tokens"] == 96
    # stored: the report recomputed from the database says the same; the CLI prints it
    again = run_report(open_database(db), rep["run_id"])
    assert again["server_timing"] == t
    assert main(["report", rep["run_id"], "--database-url", db]) == 0
    out = capsys.readouterr().out
    assert "Server's own timing (llamacpp /metrics) beside the client's" in out
    assert "20.000" in out and "1.714" in out
