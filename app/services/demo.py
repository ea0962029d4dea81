"""The demo behind ``make run``: simulator -> benchmark -> saved run -> printed report."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rich.console import Console

from app.client.spec import RunSpec
from app.services import auth
from app.services.runs import execute_bench, open_database
from app.settings import Settings
from app.storage import repository as repo
from app.storage.db import session_scope
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_process

DEMO_MODEL = "tokentrace-sim"  # the name the simulator answers to
SIM_CONFIG = SimConfig(ttft_ms=50, per_input_token_ms=0.05, itl_ms=10, itl_jitter_ms=1, seed=7)


def demo_spec(base_url: str, *, num_prompts: int, request_rate: float) -> RunSpec:
    return RunSpec(
        base_url=base_url,
        model=DEMO_MODEL,
        endpoint="chat",
        input_len=256,
        output_len=128,
        num_prompts=num_prompts,
        request_rate=request_rate,
        seed=7,
        goodput={"ttft": 150.0, "e2el": 2000.0},
        tags=["demo"],
    )


@contextlib.contextmanager
def demo_environment(settings: Settings, console: Console, *, sim_port: int) -> Iterator[str]:
    """For ``tokentrace serve --demo``: a simulator to benchmark, one saved run if the
    database has none, and an admin token printed for signing in from the browser. Yields
    the simulator's base URL (the launch forms' default target)."""
    sessions = open_database(settings.database_url)
    sim = start_simulator_process(SimConfig(**{**SIM_CONFIG.to_dict(), "port": sim_port}))
    try:
        with session_scope(sessions) as s:
            empty = not repo.list_runs(s, limit=1)
        if empty:
            console.print(f"Seeding a demo run against the simulator at {sim.base_url} ...")
            execute_bench(
                demo_spec(sim.base_url, num_prompts=100, request_rate=20.0),
                sessions=sessions,
                name="demo",
            )
        with session_scope(sessions) as s:
            _row, secret = auth.create_token(s, scopes=["admin"], name="demo-admin")
        url = f"http://{settings.host}:{settings.port}"
        console.print(
            f"\n[bold]Dashboard[/]: {url}   [bold]Simulator target[/]: {sim.base_url} "
            f"(model tokentrace-sim)\nSign in at {url}/signin with this admin token "
            f"(shown once): [bold]{secret}[/]\n"
        )
        yield sim.base_url
    finally:
        sim.stop()


def real_model_spec(base_url: str, *, num_prompts: int) -> RunSpec:
    return RunSpec(
        base_url=base_url,
        model="SmolLM2-135M-Instruct",
        endpoint="chat",
        input_len=32,
        output_len=32,
        num_prompts=num_prompts,
        max_concurrency=4,
        seed=7,
        tags=["demo", "real-model"],
    )
