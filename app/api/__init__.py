"""The REST API (``/api/v1``) served by ``tokentrace serve``."""

from app.api.app import create_app

__all__ = ["create_app"]
