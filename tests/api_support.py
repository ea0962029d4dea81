"""Helpers for the API tests: an app on a real database, tokens, and a fake worker."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from app.api.app import create_app
from app.domain import EventKind, RequestRecord, RequestStatus
from app.protocol.wire import WireRequest
from app.settings import Settings
from tests.live_server import make_token

SPEC: dict[str, Any] = {
    "base_url": "http://127.0.0.1:9",
    "model": "sim",
    "num_prompts": 6,
    "input_len": 16,
    "output_len": 4,
}

CAPS: dict[str, Any] = {
    "hostname": socket.gethostname(),
    "cpu": "test cpu",
    "cpu_count": 4,
    "gpus": [
        {
            "index": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "memory_total_mb": 81559,
            "driver_version": "550.1",
            "cuda_version": "12.4",
        }
    ],
    "torch_version": None,
    "tokentrace_version": "0.1.0",
    "labels": {"pool": "a"},
}


@dataclass
class Api:
    client: TestClient
    app: FastAPI
    db_url: str
    admin: str
    run: str
    read: str
    worker: str

    @staticmethod
    def h(token: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"} if token else {}

    @property
    def sessions(self) -> sessionmaker[Session]:
        s: sessionmaker[Session] = self.app.state.sessions
        return s

    def create_run(self, **overrides: Any) -> dict[str, Any]:
        body = SPEC | overrides
        r = self.client.post("/api/v1/runs", json=body, headers=self.h(self.run))
        assert r.status_code == 201, r.text
        out: dict[str, Any] = r.json()
        return out

    def register(self, caps: dict[str, Any] | None = None, token: str | None = None) -> str:
        body = {"name": "fake", "capabilities": caps or CAPS}
        r = self.client.post(
            "/api/v1/workers/register", json=body, headers=self.h(token or self.worker)
        )
        assert r.status_code == 200, r.text
        wid: str = r.json()["worker_id"]
        return wid

    def lease(self, worker_id: str, token: str | None = None) -> dict[str, Any] | None:
        r = self.client.post(
            f"/api/v1/workers/{worker_id}/lease", json={}, headers=self.h(token or self.worker)
        )
        assert r.status_code == 200, r.text
        job: dict[str, Any] | None = r.json()["job"]
        return job

    def post_job(self, job_id: str, what: str, body: dict[str, Any]) -> Any:
        return self.client.post(
            f"/api/v1/jobs/{job_id}/{what}", json=body, headers=self.h(self.worker)
        )


@contextmanager
def api_client(db_url: str, **settings: Any) -> Iterator[Api]:
    tokens = {
        scope: make_token(db_url, scope, name=f"test-{scope}")
        for scope in ("admin", "run", "read", "worker")
    }
    # these tests send wrong tokens on purpose, all from one client ("testclient"): no
    # limit on failed checks unless a test sets one (tests/test_auth_rate_limit.py does)
    settings = {"auth_max_failures": 1_000_000} | settings
    cfg = Settings(database_url=db_url, local_worker=False, **settings)
    app = create_app(cfg)
    with TestClient(app) as client:
        yield Api(client=client, app=app, db_url=db_url, **tokens)


def record(
    index: int, *, ok: bool = True, n_tokens: int = 4, warmup: bool = False
) -> RequestRecord:
    """A plausible request: sent at index*10 ms, first token 20 ms later, then every 5 ms."""
    sent = index * 10_000_000
    if not ok:
        return RequestRecord(
            index=index,
            scheduled_ns=sent,
            sent_ns=sent,
            end_ns=sent + 1_000_000,
            status=RequestStatus.ERROR,
            error="HTTP 500",
            http_status=500,
            warmup=warmup,
        )
    t = sent + 20_000_000 + np.arange(n_tokens, dtype=np.int64) * 5_000_000
    return RequestRecord(
        index=index,
        scheduled_ns=sent,
        sent_ns=sent,
        end_ns=int(t[-1]) + 1_000_000,
        status=RequestStatus.OK,
        http_status=200,
        input_tokens=16,
        output_tokens=n_tokens,
        usage_completion_tokens=n_tokens,
        token_source="usage",
        done_ns=int(t[-1]) + 1_000_000,
        warmup=warmup,
        event_t_ns=t,
        event_bytes=np.full(n_tokens, 7, np.int32),
        event_kind=np.full(n_tokens, int(EventKind.CONTENT), np.int8),
        event_tokens=np.ones(n_tokens, np.int32),
    )


def wire(indexes: list[int]) -> list[dict[str, Any]]:
    return [WireRequest.from_record(record(i)).model_dump(mode="json") for i in indexes]
