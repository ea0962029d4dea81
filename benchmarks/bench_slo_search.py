"""SLO capacity search against a known answer (docs/sweeps.md, "find-max").

The simulator's inter-token latency grows with the requests it holds:
``ITL = itl_ms + itl_per_active_ms x (waiting + running)``. Under a closed loop of C
concurrent requests every request's tokens come at ``itl_ms + itl_per_active_ms x C`` once
all C are in (fewer during the ramp-up and drain), so TPOT p99 = ``ITL_MS + PER_ACTIVE_MS
x C`` and the largest C meeting ``tpot p99 <= LIMIT`` is ``floor((LIMIT - ITL_MS) /
PER_ACTIVE_MS)``. The limit sits halfway between two concurrencies' TPOT, so the answer is
one integer. The search (``tokentrace sweep --find-max concurrency --slo tpot:p99:LIMIT``
through ``execute_sweep``, each probed step a stored run) must report an interval
containing it in <= 10 probed steps.

Writes ``benchmarks/results/slo_search.json`` and ``.md``. About 30 s.

    python benchmarks/bench_slo_search.py
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from app.analysis.slo_search import FindMax, Slo
from app.client.spec import RunSpec
from app.client.sweep_plan import SweepPlan
from app.services.runs import open_database
from app.services.sweeps import execute_sweep
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_process

RESULTS = Path(__file__).parent / "results"
ITL_MS = 20.0
PER_ACTIVE_MS = 4.0
TRUE_MAX = 12
LIMIT_MS = ITL_MS + PER_ACTIVE_MS * (TRUE_MAX + 0.5)  # 70 ms: C=12 gives 68, C=13 gives 72
OUTPUT_LEN = 16
PROMPTS = 32
MAX_STEPS = 10


def run_search(tmp: Path) -> dict[str, Any]:
    sessions = open_database(f"sqlite:///{tmp / 'slo.db'}")
    sim = start_simulator_process(
        SimConfig(ttft_ms=5, itl_ms=ITL_MS, itl_per_active_ms=PER_ACTIVE_MS, seed=1)
    )
    try:
        base = RunSpec(
            base_url=sim.base_url,
            model="tokentrace-sim",
            num_prompts=PROMPTS,
            input_len=16,
            output_len=OUTPUT_LEN,
            seed=1,
            scrape_metrics=False,
        )
        fm = FindMax("concurrency", (Slo("tpot", 99.0, LIMIT_MS),), 0.95, MAX_STEPS)
        t0 = time.perf_counter()
        out = execute_sweep(base, SweepPlan("find-max", (), find_max=fm), sessions=sessions)
        took = time.perf_counter() - t0
    finally:
        sim.stop()
    ans = out.summary["find_max"]
    lo, hi = ans["largest_passing"], ans["smallest_failing"]
    contains = lo is not None and lo <= TRUE_MAX and (hi is None or hi > TRUE_MAX)
    return {
        "kind": "concurrency",
        "simulator": {"itl_ms": ITL_MS, "itl_per_active_ms": PER_ACTIVE_MS, "ttft_ms": 5},
        "slo": f"tpot:p99:{LIMIT_MS:g}",
        "confidence": 0.95,
        "true_max": TRUE_MAX,
        "interval": [lo, hi],
        "contains_true_max": contains,
        "steps": ans["steps"],
        "steps_ok": ans["steps"] <= MAX_STEPS,
        "reason": ans["reason"],
        "probes": [
            {
                "load": p["load"],
                "passes": p["passes"],
                "tpot_p99_ms": p["checks"][0]["value_ms"],
                "tpot_p99_upper_ms": p["checks"][0]["upper_ms"],
                "expected_tpot_ms": ITL_MS + PER_ACTIVE_MS * p["load"],
            }
            for p in ans["probes"]
        ],
        "runs_stored": len(out.summary["steps"]),
        "seconds": round(took, 1),
    }


def markdown(r: dict[str, Any]) -> str:
    rows = "\n".join(
        f"| {p['load']:g} | {p['expected_tpot_ms']:.1f} | {p['tpot_p99_ms']:.2f} | "
        f"{p['tpot_p99_upper_ms']:.2f} | {'pass' if p['passes'] else 'fail'} |"
        for p in r["probes"]
    )
    lo, hi = r["interval"]
    return f"""# SLO capacity search on the simulator (benchmarks/bench_slo_search.py)

Simulator: ITL = {ITL_MS:g} ms + {PER_ACTIVE_MS:g} ms x requests held, so under
concurrency C every request's TPOT is {ITL_MS:g} + {PER_ACTIVE_MS:g} C ms once all C are
in. SLO `{r["slo"]}` at {r["confidence"]:g} confidence: the true largest concurrency is
**{r["true_max"]}** ({ITL_MS + PER_ACTIVE_MS * r["true_max"]:g} ms; {r["true_max"] + 1}
gives {ITL_MS + PER_ACTIVE_MS * (r["true_max"] + 1):g} ms).

Reported interval: **[{lo}, {hi}]** in **{r["steps"]}** probed steps (target <= {MAX_STEPS}),
contains the true answer: **{r["contains_true_max"]}**; {r["runs_stored"]} step runs stored;
{r["seconds"]} s. Stop: {r["reason"]}.

| concurrency | expected TPOT (ms) | TPOT p99 (ms) | upper bound (ms) | verdict |
|---:|---:|---:|---:|---|
{rows}
"""


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        r = run_search(Path(d))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "slo_search.json").write_text(json.dumps(r, indent=2) + "\n")
    (RESULTS / "slo_search.md").write_text(markdown(r))
    print(markdown(r))
    if not (r["contains_true_max"] and r["steps_ok"]):
        raise SystemExit("the reported interval misses the true answer or took too many steps")


if __name__ == "__main__":
    main()
