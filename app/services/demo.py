"""The demo behind ``make run``: simulator -> benchmark -> saved run -> printed report."""

from __future__ import annotations

from rich.console import Console
from sqlalchemy.orm import Session, sessionmaker

from app.cli.render import render_report
from app.domain import RunSpec
from app.loadgen.sim_config import SimConfig
from app.loadgen.simulator import start_simulator_process
from app.services.runs import execute_bench


def run_demo(
    sessions: sessionmaker[Session],
    console: Console,
    *,
    num_prompts: int = 200,
    request_rate: float = 20.0,
) -> int:
    config = SimConfig(ttft_ms=50, per_input_token_ms=0.05, itl_ms=10, itl_jitter_ms=1, seed=7)
    sim = start_simulator_process(config)
    try:
        console.print(
            f"[bold]Simulator[/] at {sim.base_url}: TTFT 50 ms + 0.05 ms/input token, "
            "ITL 10 ms ± 1 ms"
        )
        spec = RunSpec(
            base_url=sim.base_url,
            model="tokentrace-sim",
            endpoint="chat",
            input_len=256,
            output_len=128,
            num_prompts=num_prompts,
            request_rate=request_rate,
            seed=7,
            goodput={"ttft": 150.0, "e2el": 2000.0},
            tags=["demo"],
        )
        console.print(
            f"Benchmarking: {num_prompts} requests, Poisson {request_rate:g} req/s, "
            "256 in / 128 out tokens"
        )
        outcome = execute_bench(spec, sessions=sessions, name="demo", handle_sigint=True)
    finally:
        sim.stop()
    render_report(outcome.report, console)
    console.print(
        f"\nSaved as run [bold]{outcome.run_id}[/]. Try: tokentrace runs; "
        f"tokentrace report {outcome.run_id} --profile vllm"
    )
    return 1 if outcome.failed else 0
