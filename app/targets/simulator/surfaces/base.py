"""What the simulator's handler of one surface is (``Surface``): the surface it serves, how a
request body becomes its ``Plan`` (checks, token counts, the wire shape of its stream, or
its whole answer's bytes) and its prompt's tokens for the prefix cache."""

from __future__ import annotations

from typing import Any, Protocol

from app.targets.sim_config import SimConfig
from app.targets.simulator.plan import Plan


class Surface(Protocol):
    """The simulator's side of one registered surface (``app.client.endpoints``)."""

    endpoint: str  # the surface's name in ENDPOINTS

    def plan(self, body: dict[str, Any], path: str, config: SimConfig) -> Plan:
        """The request's plan; ``BadRequest`` (a ValueError) on a body it cannot take."""
        ...

    def prompt_tokens(self, body: dict[str, Any]) -> list[str] | None:
        """The prompt as tokens for the prefix cache (checked by ``plan``); None: a surface
        the cache does not see."""
        ...
