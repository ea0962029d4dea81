"""Errors the services raise; the API maps each to its HTTP status (see app.api.errors)."""

from __future__ import annotations

from collections.abc import Sequence


class ServiceError(Exception):
    status_code = 400

    def __init__(self, detail: str, *, loc: Sequence[str | int] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.loc = tuple(loc) if loc is not None else None


class NotFound(ServiceError):
    status_code = 404


class Forbidden(ServiceError):
    status_code = 403


class Conflict(ServiceError):
    status_code = 409


class TooLarge(ServiceError):
    """Over a size limit (the message names it and the setting that raises it)."""

    status_code = 413


class Busy(ServiceError):
    """Too many of these at once right now: retry later (the message names the limit)."""

    status_code = 429


class Invalid(ServiceError):
    """Bad input the schema could not catch; ``loc`` names the field like FastAPI's 422."""

    status_code = 422
