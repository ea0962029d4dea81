"""Target API keys are never kept in plaintext: sealed in queued jobs, opened only inside a
lease answer, gone when the job ends, not spooled by workers; or never sent to the
dashboard at all (``api_key_env``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import create_engine, text

from app.client.spec import RunSpec
from app.client.target_keys import resolve_api_key
from app.protocol.wire import LeasedJob
from app.services.secretbox import SEALED, SecretBox
from app.settings import Settings
from app.worker.spool import Spool
from tests.api_support import SPEC, api_client

KEY = "sk-live-0123456789abcdef"


def _raw_job_specs(db_url: str) -> list[str]:
    engine = create_engine(db_url)
    try:
        with engine.connect() as c:
            return [str(r[0]) for r in c.execute(text("SELECT spec FROM jobs"))]
    finally:
        engine.dispose()


def test_api_key_is_sealed_at_rest_opened_in_the_lease_and_dropped_at_the_end(
    sqlite_url: str, tmp_path: Path
) -> None:
    key_file = tmp_path / "secret.key"
    with api_client(sqlite_url, secret_key_file=str(key_file)) as api:
        r = api.client.post("/api/v1/runs", json=SPEC | {"api_key": KEY}, headers=api.h(api.run))
        assert r.status_code == 201, r.text
        specs = _raw_job_specs(sqlite_url)
        assert len(specs) == 1 and KEY not in specs[0] and SEALED in specs[0]
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        wid = api.register()
        job = api.lease(wid)
        assert job is not None and job["spec"]["api_key"] == KEY  # only inside the lease
        assert SEALED not in job["spec"]
        assert KEY not in _raw_job_specs(sqlite_url)[0]  # leasing wrote nothing plain
        done = api.post_job(
            job["job_id"],
            "complete",
            {"lease_id": job["lease_id"], "status": "failed", "error": "x", "total_batches": 0},
        )
        assert done.status_code == 200, done.text
        left = _raw_job_specs(sqlite_url)[0]
        assert KEY not in left and SEALED not in left  # an ended job keeps no key at all


def test_sealed_key_needs_the_servers_key(tmp_path: Path) -> None:
    box = SecretBox.from_settings(Settings(secret_key_file=str(tmp_path / "a.key")))
    other = SecretBox.from_settings(Settings(secret_key_file=str(tmp_path / "b.key")))
    token = box.seal(KEY)
    assert KEY not in token and box.open(token) == KEY
    with pytest.raises(ValueError, match="cannot be opened"):
        other.open(token)
    same = SecretBox.from_settings(Settings(secret_key_file=str(tmp_path / "a.key")))
    assert same.open(token) == KEY  # the key file is reused, not replaced


def test_worker_spool_keeps_no_api_key(tmp_path: Path) -> None:
    job = LeasedJob.model_validate(
        {
            "job_id": "j1",
            "kind": "bench",
            "spec": {"base_url": "http://h:1", "model": "m", "api_key": KEY},
            "run_id": "r1",
            "attempt": 1,
            "lease_id": "l1",
            "lease_expires_at": "2030-01-01T00:00:00Z",
        }
    )
    spool = Spool(tmp_path).open_job(job)
    assert spool.job.spec["api_key"] == KEY  # the running job has it in memory
    written = (spool.path / "job.json").read_text()
    assert KEY not in written
    assert stat.S_IMODE((spool.path / "job.json").stat().st_mode) == 0o600
    assert stat.S_IMODE(spool.path.stat().st_mode) == 0o700


def test_api_key_env_is_read_where_the_load_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = RunSpec(base_url="http://h:1", model="m", api_key_env="TOKENTRACE_TARGET_KEY_VLLM")
    assert "api_key_env" in spec.model_dump() and spec.model_dump().get("api_key") is None
    monkeypatch.delenv("TOKENTRACE_TARGET_KEY_VLLM", raising=False)
    with pytest.raises(ValueError, match="api_key_env: TOKENTRACE_TARGET_KEY_VLLM is not set"):
        resolve_api_key(spec)
    monkeypatch.setenv("TOKENTRACE_TARGET_KEY_VLLM", KEY)
    monkeypatch.setenv("TOKENTRACE_TARGET_KEY_VLLM_TARGETS", "h:1")  # its binding
    assert resolve_api_key(spec).api_key == KEY


@pytest.mark.parametrize(
    "name", ["TOKENTRACE_WORKER_TOKEN", "HOME", "AWS_SECRET_ACCESS_KEY", "TOKENTRACE_TARGET_KEY_"]
)
def test_api_key_env_cannot_name_other_secrets(name: str) -> None:
    """A run token holder must not make a worker send its own token (or any other secret
    of its environment) to a target of theirs."""
    with pytest.raises(ValidationError, match="api_key_env"):
        RunSpec(base_url="http://h:1", model="m", api_key_env=name)


def test_api_key_and_api_key_env_are_exclusive() -> None:
    with pytest.raises(ValidationError, match="not both"):
        RunSpec(
            base_url="http://h:1", model="m", api_key="k", api_key_env="TOKENTRACE_TARGET_KEY_A"
        )


def test_key_file_is_not_world_readable_even_with_a_loose_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        SecretBox.from_settings(Settings(secret_key_file=str(tmp_path / "k" / "s.key")))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "k" / "s.key").stat().st_mode) == 0o600
