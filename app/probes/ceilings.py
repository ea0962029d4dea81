"""``ceilings``: HBM bandwidth from large device-to-device copies (bytes read plus written)
and matrix-product FLOP/s per dtype over square and LLM-shaped sizes (SPEC section 5)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from app.probes.device import import_torch
from app.probes.spec import CeilingsParams
from app.probes.timing import stats, time_ms

CUDA_COPY_MIB = [256, 1024, 2048]  # far above any L2 (H100: 50 MiB)
CPU_COPY_MIB = [16, 64]
CUDA_SQUARE = [4096, 8192]
CPU_SQUARE = [128, 256]
CUDA_LLM = [(4096, 4096, 14336), (8192, 8192, 28672)]  # Llama 3 8B / 70B MLP up, M = 4096+
CPU_LLM = [(64, 256, 1024)]
CUDA_DTYPES = ["fp32", "tf32", "bf16", "fp16", "fp8"]
CPU_DTYPES = ["fp32", "bf16"]

Stop = Callable[[], bool]


def fp8_supported(torch: Any, dev: Any) -> bool:
    if dev.type != "cuda" or not hasattr(torch, "float8_e4m3fn"):
        return False
    return bool(torch.cuda.get_device_capability(dev) >= (8, 9))


def bandwidth(dev: Any, sizes_mib: list[int], warmup: int, iters: int) -> list[dict[str, Any]]:
    torch = import_torch()
    out: list[dict[str, Any]] = []
    for mib in sizes_mib:
        n = mib * 2**20
        src = torch.empty(n, dtype=torch.uint8, device=dev)
        src.fill_(1)
        dst = torch.empty_like(src)
        st = stats(time_ms(partial(dst.copy_, src), dev, warmup=warmup, iters=iters))
        moved = 2 * n  # read + write
        out.append(
            {
                "size_bytes": n,
                "bytes_moved": moved,
                **st,
                "median_bps": moved / (st["median_ms"] / 1e3),
                "best_bps": moved / (st["best_ms"] / 1e3),
            }
        )
    return out


def _matmul_fn(torch: Any, dev: Any, dtype: str, m: int, k: int, n: int) -> Callable[[], Any]:
    if dtype == "fp8":
        a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()  # column-major
        one = torch.tensor(1.0, device=dev)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    tdt = {
        "fp32": torch.float32,
        "tf32": torch.float32,
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
    }[dtype]
    a = torch.randn(m, k, device=dev, dtype=tdt)
    b = torch.randn(k, n, device=dev, dtype=tdt)
    return lambda: torch.matmul(a, b)


def matmuls(
    dev: Any,
    dtypes: list[str],
    shapes: list[tuple[str, int, int, int]],
    warmup: int,
    iters: int,
    stop: Stop,
) -> tuple[list[dict[str, Any]], list[str]]:
    torch = import_torch()
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for dtype in dtypes:
        if dtype == "tf32" and dev.type != "cuda":
            skipped.append("tf32: a CUDA tensor-core mode, not applicable on the CPU")
            continue
        if dtype == "fp8" and not fp8_supported(torch, dev):
            skipped.append("fp8: needs CUDA compute capability 8.9 or newer")
            continue
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        try:
            for label, m, k, n in shapes:
                if stop():
                    return rows, skipped
                fn = _matmul_fn(torch, dev, dtype, m, k, n)
                st = stats(time_ms(fn, dev, warmup=warmup, iters=iters))
                flops = 2.0 * m * k * n
                rows.append(
                    {
                        "dtype": dtype,
                        "shape": label,
                        "m": m,
                        "k": k,
                        "n": n,
                        "flops": flops,
                        **st,
                        "median_flops_s": flops / (st["median_ms"] / 1e3),
                        "best_flops_s": flops / (st["best_ms"] / 1e3),
                    }
                )
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev
    return rows, skipped


def run(dev: Any, p: CeilingsParams, stop: Stop) -> dict[str, Any]:
    cuda = dev.type == "cuda"
    copy = p.copy_mib or (CUDA_COPY_MIB if cuda else CPU_COPY_MIB)
    square = p.square or (CUDA_SQUARE if cuda else CPU_SQUARE)
    llm = p.llm_shapes if p.llm_shapes is not None else (CUDA_LLM if cuda else CPU_LLM)
    dtypes = list(p.dtypes or (CUDA_DTYPES if cuda else CPU_DTYPES))
    shapes = [(f"square {s}", s, s, s) for s in square]
    shapes += [(f"llm {m}x{k}x{n}", m, k, n) for m, k, n in llm]
    bw = bandwidth(dev, copy, p.warmup, p.iters)
    mm, skipped = matmuls(dev, dtypes, shapes, p.warmup, p.iters, stop)
    return {"bandwidth": bw, "matmul": mm, "skipped": skipped, "ceilings": summarize(bw, mm)}


def summarize(bw: list[dict[str, Any]], mm: list[dict[str, Any]]) -> dict[str, Any]:
    """The ceilings a roofline draws: the best median over sizes (medians, not lucky
    iterations), with the best single iteration beside it."""
    out: dict[str, Any] = {
        "bandwidth_bps": None,
        "bandwidth_best_bps": None,
        "flops": {},
        "flops_best": {},
    }
    if bw:
        out["bandwidth_bps"] = max(r["median_bps"] for r in bw)
        out["bandwidth_best_bps"] = max(r["best_bps"] for r in bw)
    for r in mm:
        d = r["dtype"]
        out["flops"][d] = max(out["flops"].get(d, 0.0), r["median_flops_s"])
        out["flops_best"][d] = max(out["flops_best"].get(d, 0.0), r["best_flops_s"])
    return out
