"""Streamed exports over HTTP, for the REST API and the pages' download links alike."""

from __future__ import annotations

from fastapi import HTTPException, Request
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session, sessionmaker

from app.services import exports as export_svc
from app.services.auth import Principal


def client_key(request: Request, principal: Principal | None) -> str:
    """Who asks, for the export limit: the token, else the peer address."""
    if principal is not None:
        return f"token:{principal.token_id}"
    return f"addr:{request.client.host if request.client else '?'}"


def export_response(
    request: Request,
    sessions: sessionmaker[Session],
    run_id: str,
    what: str,
    principal: Principal | None,
) -> StreamingResponse:
    """``what`` of ``run_id`` as a stream (the run must exist); 429 when this client already
    streams as many exports as it may."""
    limiter: export_svc.ExportLimiter = request.app.state.export_limiter
    client = client_key(request, principal)
    if not limiter.acquire(client):
        raise HTTPException(
            429,
            f"too many exports at once (at most {limiter.per_client} per client, "
            f"{limiter.total} in all): wait for one to finish",
            headers={"Retry-After": "5"},
        )
    try:
        stream = export_svc.export_stream(sessions, run_id, what)
    except BaseException:
        limiter.release(client)
        raise
    return StreamingResponse(
        export_svc.limited(stream, limiter, client),
        media_type=export_svc.FORMATS[what],
        headers={"Content-Disposition": f'attachment; filename="{run_id}-{what}"'},
    )
