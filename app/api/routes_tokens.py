"""/api/v1/tokens (admin): create, list and revoke API tokens."""

from __future__ import annotations

from fastapi import APIRouter, status

from app.api import convert
from app.api.deps import Admin, SessionDep
from app.api.schemas import TokenCreate, TokenCreated, TokenInfo
from app.services import auth
from app.services.errors import NotFound

router = APIRouter(prefix="/api/v1/tokens", tags=["tokens"])


@router.post("", status_code=status.HTTP_201_CREATED)
def create_token(body: TokenCreate, session: SessionDep, _: Admin) -> TokenCreated:
    """A new token; its secret is in this answer only."""
    row, secret = auth.create_token(session, scopes=list(body.scopes), name=body.name)
    return TokenCreated(**convert.token_info(row).model_dump(), secret=secret)


@router.get("")
def list_tokens(session: SessionDep, _: Admin) -> list[TokenInfo]:
    return [convert.token_info(t) for t in auth.list_tokens(session)]


@router.delete("/{token_id}")
def revoke_token(token_id: str, session: SessionDep, _: Admin) -> TokenInfo:
    """Revoke a token (it stops working at once; the row stays for the record)."""
    row = auth.revoke_token(session, token_id)
    if row is None:
        raise NotFound(f"no token with id {token_id!r}")
    return convert.token_info(row)
