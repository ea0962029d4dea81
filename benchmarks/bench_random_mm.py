"""random-mm benchmark: time to build a run's multimodal prompts and what they hold.

    python benchmarks/bench_random_mm.py [--prompts 1000] [--sizes 512x512 1024x1024]
        [--out benchmarks/results/random_mm.json]

In one process, with the built-in tokenizer: ``build_workload`` of a ``random-mm`` run of
``prompts`` prompts (64-token text, one image each) for each image size: the build's wall
time, per image, the PNG data URLs' total size and the process's peak RSS after it. The
images are seeded noise of 8x8-pixel cells written with zlib alone
(``app.client.datasets.images``).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.client.spec import RunSpec
from app.client.tokenizer import BuiltinTokenizer
from app.client.workload import build_workload


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=1000)
    ap.add_argument("--sizes", nargs="+", default=["512x512", "1024x1024"])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "random_mm.json"))
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for size in args.sizes:
        spec = RunSpec(base_url="http://h:1", model="m", dataset="random-mm", input_len=64,
                       num_prompts=args.prompts, dataset_options={"image_size": size})  # fmt: skip
        t = time.perf_counter()
        w = build_workload(spec, BuiltinTokenizer())
        dt = time.perf_counter() - t
        urls = sum(
            len(part["image_url"]["url"])
            for p in w.measured
            for part in (p.messages or [{}])[0].get("content", [])[1:]
        )
        rows.append({
            "image_size": size,
            "prompts": len(w.measured),
            "build_s": round(dt, 3),
            "ms_per_image": round(dt * 1000 / len(w.measured), 3),
            "data_url_mb": round(urls / 1e6, 2),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        })  # fmt: skip
        del w
    out = {"python": platform.python_version(), "machine": platform.machine(), "runs": rows}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
