"""Importers of other tools' files (pure parsers): vLLM, GuideLLM, AIPerf, Prometheus text.

GuideLLM and AIPerf fixtures are real files those tools wrote (GuideLLM 0.8.1, AIPerf 0.13.0,
both run against the simulator); vLLM files are built here with the keys of vLLM's
``bench serve`` source, figures computed with vLLM's own formulas (numpy).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.analysis.profiles import profile_metrics
from app.domain import RequestStatus, trace_from_records
from app.importers.aiperf_export import parse_aiperf
from app.importers.common import ImportFormatError
from app.importers.guidellm_json import parse_guidellm
from app.importers.vllm_result import parse_vllm_result
from app.protocol.prometheus import (
    PrometheusFormatError,
    add_scrape,
    counter_rate,
    parse_text,
    select,
    wanted,
)
from app.targets.sim_config import SimConfig
from app.targets.simulator.server import SimServer

FIX = Path(__file__).parent / "fixtures" / "interop"
SHARED = Path(__file__).resolve().parent / "fixtures" / "shared"

# request: start (s), ttft (s), chunk gaps (s), output tokens, error
REQS: list[tuple[float, float, list[float], int, str]] = [
    (0.00, 0.100, [0.040, 0.040, 0.040], 4, ""),
    (0.01, 0.150, [], 1, ""),
    (0.02, 0.180, [0.100, 0.100], 3, ""),
    (0.03, 0.0, [], 0, "TimeoutError"),
    (0.05, 0.120, [0.030, 0.050], 5, ""),  # 5 tokens in 3 chunks
]


def vllm_object(*, detailed: bool = True, start_times: bool = True, **extra: Any) -> dict[str, Any]:
    """A ``vllm bench serve`` result: figures by vLLM's formulas over REQS."""
    ok = [r for r in REQS if not r[4]]
    ttfts = np.array([r[1] for r in ok])
    lat = np.array([r[1] + sum(r[2]) for r in ok])
    n = np.array([r[3] for r in ok])
    tpots = np.array([(lat[i] - ttfts[i]) / (n[i] - 1) for i in range(len(ok)) if n[i] > 1])
    itls = np.array([g for r in ok for g in r[2]])
    duration = 0.6
    obj: dict[str, Any] = {
        "date": "20261201-120000",
        "endpoint_type": "openai-chat",
        "backend": "openai-chat",
        "label": None,
        "model_id": "meta/llama",
        "tokenizer_id": "meta/llama",
        "num_prompts": len(REQS),
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": None,
        "duration": duration,
        "completed": len(ok),
        "failed": len(REQS) - len(ok),
        "total_input_tokens": 10 * len(ok),
        "total_output_tokens": int(n.sum()),
        "request_throughput": len(ok) / duration,
        "request_goodput": None,
        "output_throughput": n.sum() / duration,
        "total_token_throughput": (n.sum() + 10 * len(ok)) / duration,
        "max_output_tokens_per_s": 13.0,
        "max_concurrent_requests": 5,
    }
    for m, arr in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", lat)):
        obj[f"mean_{m}_ms"] = float(np.mean(arr)) * 1000
        obj[f"median_{m}_ms"] = float(np.median(arr)) * 1000
        obj[f"std_{m}_ms"] = float(np.std(arr)) * 1000
        for p in (90, 99, 99.9):
            key = str(int(p)) if int(p) == p else str(p)
            obj[f"p{key}_{m}_ms"] = float(np.percentile(arr, p)) * 1000
    if detailed:
        obj["input_lens"] = [10] * len(REQS)
        obj["output_lens"] = [r[3] for r in REQS]
        obj["ttfts"] = [r[1] for r in REQS]
        obj["itls"] = [list(r[2]) for r in REQS]
        obj["generated_texts"] = ["x" * r[3] for r in REQS]
        obj["errors"] = [r[4] for r in REQS]
        if start_times:
            obj["start_times"] = [1000.0 + r[0] for r in REQS]
    obj.update(extra)
    return obj


def test_vllm_detailed_reproduces_vllm_figures() -> None:
    (run,) = parse_vllm_result(json.dumps(vllm_object()), name="v.json")
    assert run.format == "vllm" and run.profile == "vllm" and not run.summary_only
    assert len(run.records) == len(REQS)
    failed = run.records[3]
    assert failed.status is RequestStatus.ERROR and failed.error == "TimeoutError"
    first = run.records[0]
    assert first.sent_ns == 0
    assert first.event_t_ns.tolist() == [100_000_000, 140_000_000, 180_000_000, 220_000_000]
    assert run.records[4].sent_ns == 50_000_000 and run.records[4].output_tokens == 5
    assert any("more output tokens than chunks" in n for n in run.notes)
    trace = trace_from_records(run.records, summary_only=run.summary_only)
    ours = profile_metrics(trace, "vllm", window_ns=(0, 600_000_000)).to_dict()["metrics"]
    for m in ("ttft", "tpot", "itl", "e2el"):
        assert ours[m]["mean"] == pytest.approx(run.figures[m]["mean"], rel=1e-6), m
        assert ours[m]["p50"] == pytest.approx(run.figures[m]["p50"], rel=1e-6), m
        assert ours[m]["p99"] == pytest.approx(run.figures[m]["p99"], rel=1e-6), m
        assert ours[m]["p99_9"] == pytest.approx(run.figures[m]["p99_9"], rel=1e-6), m
    for m in ("request_throughput", "output_throughput"):
        assert ours[m]["value"] == pytest.approx(run.figures[m]["value"], rel=1e-9), m
    assert run.window_s == 0.6 and run.meta["request_rate"] == "inf"


def test_vllm_summary_only_and_appended_objects() -> None:
    text = "\n".join(
        json.dumps(vllm_object(detailed=False, request_rate=r, max_concurrency=c))
        for r, c in ((1.0, None), (4.0, 8))
    )
    runs = parse_vllm_result(text, name="sweep.json")
    assert [r.summary_only for r in runs] == [True, True]
    assert [len(r.records) for r in runs] == [0, 0]
    assert runs[1].name == "sweep.json #2 (openai-chat, rate 4, concurrency 8)"
    assert runs[0].figures["ttft"]["mean"] == pytest.approx(vllm_object()["mean_ttft_ms"])
    assert runs[0].figures["request_goodput"] == {"value": None}


def test_vllm_without_start_times_says_so() -> None:
    (run,) = parse_vllm_result(json.dumps(vllm_object(start_times=False)))
    assert {r.sent_ns for r in run.records} == {0}
    assert any("no start_times" in n for n in run.notes)


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda o: o.pop("duration"), "missing 'duration'"),
        (lambda o: o.__setitem__("ttfts", o["ttfts"][:-1]), "ttfts has 4"),
        (lambda o: o["itls"].__setitem__(2, "x"), "request 2: itls"),
        (lambda o: o["itls"][0].__setitem__(1, -0.1), "itls[1]: must be >= 0"),
        (lambda o: o["output_lens"].__setitem__(0, 1.5), "output_lens"),
        (lambda o: o.pop("itls"), "per-request arrays incomplete"),
        (lambda o: o.__setitem__("mean_ttft_ms", "fast"), "mean_ttft_ms"),
    ],
)
def test_vllm_malformed_names_the_field(mutate: Any, needle: str) -> None:
    obj = vllm_object()
    mutate(obj)
    with pytest.raises(ImportFormatError) as e:
        parse_vllm_result(json.dumps(obj))
    assert needle in str(e.value)


def test_vllm_bad_second_object_names_its_line() -> None:
    text = json.dumps(vllm_object()) + "\n" + '{"duration": 1,,}'
    with pytest.raises(ImportFormatError, match="line 2"):
        parse_vllm_result(text)
    text = json.dumps(vllm_object()) + "\n" + json.dumps(vllm_object(completed=-1))
    with pytest.raises(ImportFormatError, match=r"object 2\.completed"):
        parse_vllm_result(text)


# --------------------------------------------------------------------------- GuideLLM


def test_guidellm_real_file_every_benchmark_a_run() -> None:
    text = (FIX / "guidellm-benchmarks.json").read_text()
    runs = parse_guidellm(text, name="g")
    raw = json.loads(text)
    assert len(runs) == len(raw["benchmarks"]) == 2
    assert [r.name for r in runs] == ["g #1 (concurrent streams 1)", "g #2 (concurrent streams 2)"]
    for run, bench in zip(runs, raw["benchmarks"], strict=True):
        assert run.summary_only and run.profile == "guidellm" and run.tool == "GuideLLM 0.8.1"
        assert len(run.records) == len(bench["requests"]["successful"])
        rec = run.records[0]
        assert rec.event_tokens.tolist() == [1, 15]
        trace = trace_from_records(run.records, summary_only=True)
        ours = profile_metrics(trace, "guidellm").to_dict()["metrics"]
        for key, name in (("ttft", "time_to_first_token_ms"), ("itl", "inter_token_latency_ms")):
            theirs = bench["metrics"][name]["successful"]
            assert ours[key]["mean"] == pytest.approx(theirs["mean"], rel=1e-5), key
            assert ours[key]["p50"] == pytest.approx(theirs["percentiles"]["p50"], rel=1e-5)
            assert run.figures[key]["p99"] == pytest.approx(theirs["percentiles"]["p99"])
        tpot = bench["metrics"]["time_per_output_token_ms"]["successful"]
        assert ours["tpot"]["mean"] == pytest.approx(tpot["mean"], rel=1e-4)
        lat = bench["metrics"]["request_latency"]["successful"]["mean"] * 1000
        assert ours["e2el"]["mean"] == pytest.approx(lat, rel=1e-5)
        assert run.figures["e2el"]["mean"] == pytest.approx(lat)


def _with_warmup() -> tuple[dict[str, Any], float, float]:
    """The real file with benchmark 0's measurement window narrowed, as GuideLLM writes it
    with a warm-up and a cool-down: its first request ends before the window starts, its last
    starts after it ends (GuideLLM keeps both in ``requests``, not in its metrics)."""
    obj = json.loads((FIX / "guidellm-benchmarks.json").read_text())
    bench = obj["benchmarks"][0]
    reqs = bench["requests"]["successful"]
    lo = reqs[0]["info"]["timings"]["request_end"] + reqs[1]["info"]["timings"]["request_start"]
    hi = reqs[4]["info"]["timings"]["request_end"] + reqs[5]["info"]["timings"]["request_start"]
    lo, hi = lo / 2, hi / 2
    bench["start_time"], bench["end_time"] = lo, hi
    bench["scheduler_metrics"]["measure_start_time"] = lo
    bench["scheduler_metrics"]["measure_end_time"] = hi
    return obj, lo, hi


def test_guidellm_warmup_and_cooldown_requests_are_excluded() -> None:
    obj, lo, hi = _with_warmup()
    (run, second) = parse_guidellm(json.dumps(obj), name="g")
    reqs = obj["benchmarks"][0]["requests"]["successful"]
    # independently: GuideLLM's rule over the raw timings
    inside = [
        r for r in reqs
        if r["info"]["timings"]["request_end"] >= lo and r["info"]["timings"]["request_start"] <= hi
    ]  # fmt: skip
    assert len(inside) == 4 and len(run.records) == 6
    assert [r.warmup for r in run.records] == [True, False, False, False, False, True]
    assert not any(r.warmup for r in second.records)  # benchmark 1 had no warm-up
    trace = trace_from_records(run.records, summary_only=True)  # warm-ups dropped
    ours = profile_metrics(trace, "guidellm").to_dict()["metrics"]
    ttft = [
        (r["info"]["timings"]["first_token_iteration"] - r["info"]["timings"]["request_start"])
        * 1000
        for r in inside
    ]
    assert ours["ttft"]["mean"] == pytest.approx(float(np.mean(ttft)), rel=1e-6)
    lat = [r["info"]["timings"]["request_end"] - r["info"]["timings"]["request_start"]
           for r in inside]  # fmt: skip
    assert ours["e2el"]["mean"] == pytest.approx(float(np.mean(lat)) * 1000, rel=1e-6)
    assert any("2 of 6 requests in the file lie outside" in n for n in run.notes)
    # the file's metrics (left as they were, from 6 requests) disagree with the 4 kept
    assert any("GuideLLM counts 6 successful requests" in n for n in run.notes)
    # the real file: every request inside its window, the counts agree, nothing noted
    real = parse_guidellm((FIX / "guidellm-benchmarks.json").read_text())
    assert all(not r.warmup for run_ in real for r in run_.records)
    assert all(len(run_.notes) == 1 for run_ in real)


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        (("benchmarks",), [], "benchmarks: the list is empty"),
        (("benchmarks", 0, "requests", "successful", 1, "info", "timings", "request_start"),
         "soon", "benchmarks[0].requests.successful[1].info.timings.request_start"),
        (("benchmarks", 1, "requests", "successful", 0, "output_tokens"), -3, "output_tokens"),
        (("benchmarks", 0, "metrics", "time_to_first_token_ms", "successful", "percentiles"),
         {"p5o": 1}, "unknown key 'p5o'"),
    ],
)  # fmt: skip
def test_guidellm_malformed_names_the_field(path: tuple[Any, ...], value: Any, needle: str) -> None:
    obj = json.loads((FIX / "guidellm-benchmarks.json").read_text())
    node = obj
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ImportFormatError) as e:
        parse_guidellm(json.dumps(obj))
    assert needle in str(e.value)


# --------------------------------------------------------------------------- AIPerf


def test_aiperf_real_export_reproduces_its_summary() -> None:
    jsonl = (FIX / "aiperf" / "profile_export.jsonl").read_text()
    summary = (FIX / "aiperf" / "profile_export_aiperf.json").read_text()
    run = parse_aiperf(jsonl, summary, name="a")
    lines = [json.loads(x) for x in jsonl.splitlines()]
    assert len(run.records) == len(lines) == 12 and not run.summary_only
    r0, l0 = run.records[0], lines[0]["metrics"]
    assert r0.event_t_ns.shape[0] == len(l0["inter_chunk_latency"]["value"]) + 1
    assert (r0.event_t_ns[0] - r0.sent_ns) / 1e6 == pytest.approx(
        l0["time_to_first_token"]["value"], abs=1e-5
    )
    assert r0.output_tokens == 16 and r0.usage_completion_tokens == 16
    trace = trace_from_records(run.records)
    ours = profile_metrics(trace, "aiperf").to_dict()["metrics"]
    s = json.loads(summary)
    for key, name in (
        ("ttft", "time_to_first_token"),
        ("itl", "inter_token_latency"),
        ("e2el", "request_latency"),
        ("ttst", "time_to_second_token"),
    ):
        assert ours[key]["mean"] == pytest.approx(s[name]["avg"], rel=1e-5), key
        assert ours[key]["p50"] == pytest.approx(s[name]["p50"], rel=1e-5), key
        assert ours[key]["p90"] == pytest.approx(s[name]["p90"], rel=1e-5), key
        assert run.figures[key]["p99"] == pytest.approx(s[name]["p99"])
    assert run.window_s == pytest.approx(s["benchmark_duration"]["avg"])
    assert run.tool == "AIPerf 0.13.0"


def test_aiperf_errors_and_missing_summary() -> None:
    jsonl = (FIX / "aiperf-errors" / "profile_export.jsonl").read_text()
    run = parse_aiperf(jsonl, None)
    failed = [r for r in run.records if r.status is RequestStatus.ERROR]
    assert len(failed) == 2 and all("simulated server error" in (r.error or "") for r in failed)
    assert all(r.input_tokens == 32 for r in failed)
    assert run.figures == {} and any("no summary" in n for n in run.notes)


def test_aiperf_malformed_line_is_named() -> None:
    lines = (FIX / "aiperf" / "profile_export.jsonl").read_text().splitlines()
    bad = json.loads(lines[4])
    bad["metrics"]["time_to_first_token"]["value"] = "slow"
    text = "\n".join([*lines[:4], json.dumps(bad), *lines[5:]])
    with pytest.raises(ImportFormatError, match=r"line 5\.metrics\.time_to_first_token"):
        parse_aiperf(text)
    with pytest.raises(ImportFormatError, match="line 3"):
        parse_aiperf("\n".join([*lines[:2], "{not json", *lines[3:]]))


# --------------------------------------------------------------------------- Prometheus


def test_prometheus_llamacpp_capture() -> None:
    text = (SHARED / "llamacpp-metrics-during-load.prom").read_text()
    samples, kinds = parse_text(text)
    by_name = {s.name: s.value for s in samples}
    assert by_name["llamacpp:requests_processing"] == 3
    assert kinds["llamacpp:tokens_predicted_total"] == "counter"
    kept = select(samples, wanted())
    assert {s.name for s in kept} == {
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "llamacpp:prompt_tokens_total",
        "llamacpp:tokens_predicted_total",
        "llamacpp:prompt_seconds_total",  # the server's own prefill time
        "llamacpp:tokens_predicted_seconds_total",  # and decode time
    }
    extra = select(samples, wanted(["llamacpp:n_busy_slots_per_decode"]))
    assert len(extra) == len(kept) + 1


def test_prometheus_simulator_names_and_series() -> None:
    sim = SimServer(SimConfig())
    samples, kinds = parse_text(sim.metrics_text())
    kept = select(samples, wanted())
    names = {s.name for s in kept}
    assert {"vllm:num_requests_running", "vllm:gpu_cache_usage_perc"} <= names
    assert dict(kept[0].labels) == {"model_name": SimConfig().model}
    series: dict[Any, Any] = {}
    add_scrape(series, 1_000, kept, kinds)
    add_scrape(series, 2_000_000_000, kept, kinds)
    run = next(s for s in series.values() if s.name == "vllm:num_requests_running")
    assert run.t_ns == [1_000, 2_000_000_000] and run.role == "running"
    assert next(s for s in series.values() if s.role == "generation_tokens").kind == "counter"


def test_prometheus_text_details() -> None:
    text = '# TYPE a gauge\na{x="1",y="q\\"z"} 2.5 1700000000\nb NaN\nc +Inf\n'
    samples, kinds = parse_text(text)
    assert samples[0].labels == (("x", "1"), ("y", 'q"z')) and samples[0].value == 2.5
    assert kinds == {"a": "gauge"}
    assert [s.name for s in select(samples, frozenset({"a", "b"}))] == ["a"]  # NaN dropped
    with pytest.raises(PrometheusFormatError, match="line 2"):
        parse_text("ok 1\nnot a sample line\n")
    with pytest.raises(PrometheusFormatError, match="line 1"):
        parse_text("m{x=1} 2\n")
    assert counter_rate([0, 1_000_000_000, 2_000_000_000, 3_000_000_000], [0, 10, 5, 25]) == (
        [0.5, 2.5],
        [10.0, 20.0],
    )


def test_cli_report_of_an_import_prints_the_files_figures_beside_ours(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli.main import main

    obj, _lo, _hi = _with_warmup()
    path = tmp_path / "g.json"
    path.write_text(json.dumps(obj))
    db = ["--database-url", f"sqlite:///{tmp_path / 'g.db'}"]
    assert main(["import", "guidellm", str(path), "--json", *db]) == 0
    first = json.loads(capsys.readouterr().out)["runs"][0]
    assert main(["report", first, *db]) == 0
    out = capsys.readouterr().out
    assert "GuideLLM 0.8.1's own figures (g.json) beside ours" in out
    assert main(["report", first, "--json", *db]) == 0
    rep = json.loads(capsys.readouterr().out)
    rows = {(r["metric"], r["stat"]): r for r in rep["file_figures"]["rows"]}
    bench = obj["benchmarks"][0]
    ttft = rows[("ttft", "mean")]
    assert ttft["file"] == pytest.approx(
        bench["metrics"]["time_to_first_token_ms"]["successful"]["mean"]
    )
    inside = bench["requests"]["successful"][1:5]  # the 4 requests in the window
    mean = np.mean(
        [
            (r["info"]["timings"]["first_token_iteration"] - r["info"]["timings"]["request_start"])
            * 1000
            for r in inside
        ]
    )
    assert ttft["ours"] == pytest.approx(float(mean), rel=1e-6)
    assert ttft["diff_pct"] == pytest.approx((ttft["ours"] - ttft["file"]) / ttft["file"] * 100)
    assert rep["metrics"]["requests"]["sent"] == 4  # warm-up and cool-down excluded
