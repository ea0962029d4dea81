"""Schemathesis against the OpenAPI document, in-process: every operation, without a token
and with an admin token, finds no 5xx and no response that breaks the documented schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from app.api.app import create_app
from app.settings import Settings
from app.storage.db import upgrade_database
from tests.live_server import make_token

EXAMPLES = 8  # per operation and token: the whole file runs in well under a minute
CHECKS = [not_a_server_error, response_schema_conformance]


class Fuzzed:
    def __init__(self, client: TestClient, admin: str) -> None:
        self.client = client
        self.admin = admin


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    db = Path(tmp_path_factory.mktemp("fuzz")) / "fuzz.db"
    url = f"sqlite:///{db}"
    upgrade_database(url)
    admin = make_token(url, "admin", name="fuzz-admin")
    app = create_app(Settings(database_url=url, local_worker=False))
    with TestClient(app) as client:  # runs the lifespan: the app's database is open
        yield Fuzzed(client, admin)


@pytest.fixture(scope="module")
def api_schema(fuzzed: Fuzzed) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_asgi("/openapi.json", fuzzed.client.app)


def _operations() -> list[tuple[str, str]]:
    """(method, path) of every documented operation (the document needs no database)."""
    doc = create_app(Settings(database_url="sqlite://", local_worker=False)).openapi()
    return [
        (method.upper(), path)
        for path, item in doc["paths"].items()
        for method in item
        if method in ("get", "post", "put", "delete", "patch")
    ]


OPERATIONS = _operations()
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
    derandomize=True,
)


def _fuzz(schema: schemathesis.BaseSchema, method: str, path: str, token: str | None) -> None:
    operation = schema[path][method]
    headers = {"Authorization": f"Bearer {token}"} if token else None

    @given(case=operation.as_strategy())
    @FUZZ_SETTINGS
    def run(case: schemathesis.Case) -> None:
        if token is None and case.headers:
            case.headers.pop("Authorization", None)
        case.call_and_validate(headers=headers, checks=CHECKS)

    run()


def test_every_operation_is_fuzzed() -> None:
    assert len(OPERATIONS) >= 17
    assert ("POST", "/api/v1/jobs/{job_id}/results") in OPERATIONS


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_without_a_token(method: str, path: str, api_schema: schemathesis.BaseSchema) -> None:
    _fuzz(api_schema, method, path, None)


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_with_an_admin_token(
    method: str, path: str, api_schema: schemathesis.BaseSchema, fuzzed: Fuzzed
) -> None:
    _fuzz(api_schema, method, path, fuzzed.admin)
