"""``shards`` (issue 26, one run over K workers): a whole number from 1 to 256 in the run
spec, the REST launch, ``tokentrace bench --server ... --shards K`` and the launch form;
anything else is a 422 / exit 2 naming it, nothing stored. A local ``bench`` (no
``--server``) and a sweep refuse K above 1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import func, select

from app.cli.main import main
from app.client.spec import RunSpec
from app.storage.models import Run
from app.web import launch_form
from tests.api_support import SPEC, Api, api_client

pytestmark = pytest.mark.timeout(60)


def test_spec_takes_a_count_from_1_to_256() -> None:
    base = {"base_url": "http://127.0.0.1:9", "model": "m"}
    assert RunSpec.model_validate(base).shards == 1
    assert RunSpec.model_validate(base | {"shards": 256}).shards == 256
    assert RunSpec.model_validate(base | {"shards": "4"}).shards == 4
    for bad in (0, -1, 257, 1.5, "x", True):
        with pytest.raises(ValidationError, match="shards: a whole number from 1 to 256"):
            RunSpec.model_validate(base | {"shards": bad})
    with pytest.raises(ValidationError, match=r"reset_prefix_cache: runs on one worker only"):
        RunSpec.model_validate(base | {"shards": 2, "reset_prefix_cache": True})


def test_launch_form_has_the_field() -> None:
    assert "shards" in {f.name for f in launch_form.FIELDS}


@pytest.fixture
def api(sqlite_url: str) -> Iterator[Api]:
    with api_client(sqlite_url) as a:
        yield a


@pytest.mark.parametrize("value", [0, -2, 257, 1.5, "many"])
def test_api_refuses_bad_shards_with_422(api: Api, value: Any) -> None:
    for path in ("/api/v1/runs", "/api/v1/sweeps"):
        body = SPEC | {"shards": value} | ({"rates": [1.0]} if "sweeps" in path else {})
        r = api.client.post(path, json=body, headers=api.h(api.run))
        assert r.status_code == 422, (path, r.status_code, r.text[:300])
        assert r.json()["detail"][0]["loc"][-1] == "shards", r.text[:300]
    with api.sessions() as s:
        assert int(s.scalar(select(func.count()).select_from(Run)) or 0) == 0


def test_a_sharded_sweep_is_refused_naming_shards(api: Api) -> None:
    body = SPEC | {"shards": 2, "rates": [1.0]}
    r = api.client.post("/api/v1/sweeps", json=body, headers=api.h(api.run))
    assert r.status_code == 422, r.text[:300]
    assert r.json()["detail"][0]["loc"][-1] == "shards"


@pytest.mark.parametrize("value", ["0", "-1", "257", "1.5", "x"])
def test_cli_refuses_bad_shards_with_exit_2(capsys: pytest.CaptureFixture[str], value: str) -> None:
    args = ["bench", "--model", "m", "--base-url", "http://127.0.0.1:9"]
    args += ["--server", "http://127.0.0.1:9", "--token", "t", f"--shards={value}"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--shards" in err[0], err


def test_cli_refuses_shards_without_a_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    args = ["bench", "--model", "m", "--base-url", "http://127.0.0.1:9", "--database-url", url]
    assert main([*args, "--shards", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--shards" in err[0] and "--server" in err[0], err


def test_a_sharded_run_is_k_leases_each_knowing_its_shard(api: Api) -> None:
    out = api.create_run(shards=2)
    leases = [api.lease(api.register()) for _ in range(3)]
    assert leases[2] is None  # two jobs, one run
    assert [j["shard"] for j in leases[:2] if j] == [0, 1]
    assert {j["run_id"] for j in leases[:2] if j} == {out["run_id"]}
    assert all(j and j["spec"]["shards"] == 2 for j in leases[:2])
