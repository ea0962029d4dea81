"""``tokentrace demo``: simulator (or the bundled llama.cpp) -> benchmark -> saved run ->
printed report."""

from __future__ import annotations

from rich.console import Console
from sqlalchemy.orm import Session, sessionmaker

from app.cli.render import render_report
from app.services.demo import SIM_CONFIG, demo_spec, real_model_spec
from app.services.runs import execute_bench
from app.targets.simulator import start_simulator_process


def run_demo(
    sessions: sessionmaker[Session],
    console: Console,
    *,
    num_prompts: int = 200,
    request_rate: float = 20.0,
) -> int:
    sim = start_simulator_process(SIM_CONFIG)
    try:
        console.print(
            f"[bold]Simulator[/] at {sim.base_url}: TTFT 50 ms + 0.05 ms/input token, "
            "ITL 10 ms ± 1 ms"
        )
        spec = demo_spec(sim.base_url, num_prompts=num_prompts, request_rate=request_rate)
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


def run_real_model_demo(
    sessions: sessionmaker[Session], console: Console, *, num_prompts: int = 8
) -> int:
    """``tokentrace demo --real-model``: llama.cpp's server with SmolLM2-135M on loopback
    (CPU), benchmarked with a few short requests; real token timings without a GPU."""
    from app.targets.llamacpp import RealModelUnavailable, start_llamacpp_process

    try:
        server = start_llamacpp_process()
    except RealModelUnavailable as e:
        console.print(f"[red]{e}[/]")
        return 2
    try:
        console.print(
            f"[bold]llama.cpp server[/] at {server.base_url}: SmolLM2-135M-Instruct "
            f"({server.model_path.name}), 4 parallel slots, CPU"
        )
        console.print(f"Benchmarking: {num_prompts} requests, 4 at a time, 32 in / 32 out tokens")
        outcome = execute_bench(
            real_model_spec(server.base_url, num_prompts=num_prompts),
            sessions=sessions,
            name="demo (real model)",
            handle_sigint=True,
        )
    finally:
        server.stop()
    render_report(outcome.report, console)
    console.print(
        f"\nSaved as run [bold]{outcome.run_id}[/] (with the server's /metrics series). "
        f"Try: tokentrace serve, then open /runs/{outcome.run_id}"
    )
    return 1 if outcome.failed else 0
