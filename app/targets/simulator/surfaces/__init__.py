"""The simulator's handler of each registered surface (``app.client.endpoints.ENDPOINTS``),
by the surface's name (``HANDLERS``), and the routes they serve: every path of every
surface (``routes``, read when a server starts), so the simulator answers each surface the
client can speak.

Adding a surface: its handler module here and its line in ``HANDLERS``
(``tests/test_endpoint_is_one_module.py`` checks every registered surface has one).
"""

from __future__ import annotations

from app.client.endpoints import ENDPOINTS
from app.targets.simulator.surfaces.anthropic_messages import ANTHROPIC_MESSAGES_SURFACE
from app.targets.simulator.surfaces.base import Surface
from app.targets.simulator.surfaces.chat import CHAT_SURFACE
from app.targets.simulator.surfaces.completions import COMPLETIONS_SURFACE
from app.targets.simulator.surfaces.embeddings import EMBEDDINGS_SURFACE
from app.targets.simulator.surfaces.rerank import RERANK_SURFACE
from app.targets.simulator.surfaces.responses import RESPONSES_SURFACE

HANDLERS: dict[str, Surface] = {
    s.endpoint: s
    for s in (
        CHAT_SURFACE,
        COMPLETIONS_SURFACE,
        EMBEDDINGS_SURFACE,
        RERANK_SURFACE,
        RESPONSES_SURFACE,
        ANTHROPIC_MESSAGES_SURFACE,
    )
}


def routes(handlers: dict[str, Surface]) -> dict[str, Surface]:
    """Each path of each registered surface -> its handler (a surface without one is not
    served: a 404 names the path)."""
    return {p: handlers[e.name] for e in ENDPOINTS.values() if e.name in handlers for p in e.paths}
