"""What a run may ask a worker to send, and where (issue 23, item 8): no CR/LF, NUL or other
control character in ``base_url``, ``metrics_url`` or ``api_key`` (a request line or header
split in two), no credentials in a URL (stored and listed with the run), and a bound on
``request_timeout_s`` and ``max_duration_s``. Each is a 422 naming the field over the API,
exit 2 with one line on the CLI, and stores nothing."""

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
from tests.api_support import SPEC, Api, api_client

KEY = "sk-live-0123456789abcdef"

BAD_FIELDS: list[tuple[str, Any, str]] = [
    ("base_url", "http://127.0.0.1:9\r\nX-Injected: 1", "U+000D"),
    ("base_url", "http://127.0.0.1:9/v1\n", "U+000A"),
    ("base_url", "http://127.0.0.1:9\x00", "U+0000"),
    ("base_url", "http://127.0.0.1:9/\tv1", "U+0009"),
    ("base_url", "http://127.0.0.1:9/a b", "U+0020"),
    ("base_url", "http://127.0.0.1:9/\x7f", "U+007F"),
    ("base_url", "http://127.0.0.1:9/\u2028", "U+2028"),
    ("base_url", f"http://user:{KEY}@127.0.0.1:9", "credentials"),
    ("base_url", f"https://{KEY}@api.example.com/v1", "credentials"),
    ("base_url", "http://127.0.0.1:99999", "port"),
    ("base_url", "http://:80", "no host"),
    ("metrics_url", "http://127.0.0.1:9/metrics\r\nX: 1", "U+000D"),
    ("metrics_url", f"http://u:{KEY}@127.0.0.1:9/metrics", "credentials"),
    ("api_key", KEY + "\r\nX-Injected: 1", "api_key"),
    ("api_key", KEY + "\x00", "api_key"),
    ("api_key", "sk live", "api_key"),
    ("api_key", "k" * 8193, "api_key"),
    ("request_timeout_s", 86_401, "86400"),
    ("request_timeout_s", 1e300, "86400"),
    ("max_duration_s", 1e300, "2592000"),
    ("api_key_env", "TOKENTRACE_TARGET_KEY_X_TARGETS", "binding"),
]


@pytest.mark.parametrize(("field", "value", "says"), BAD_FIELDS)
def test_spec_refuses(field: str, value: Any, says: str) -> None:
    with pytest.raises(ValidationError) as e:
        RunSpec.model_validate(SPEC | {field: value})
    err = e.value.errors()[0]
    assert err["loc"] == (field,), err
    assert says in err["msg"], err["msg"]
    assert KEY not in err["msg"]


def test_ordinary_urls_keys_and_limits_pass() -> None:
    spec = RunSpec.model_validate(
        SPEC
        | {
            "base_url": "https://api.example.com:8443/v1/",
            "metrics_url": "https://api.example.com:9100/metrics?x=1",
            "api_key": "sk-proj_AZaz09-._~+/=",
            "request_timeout_s": 86_400,
            "max_duration_s": 30 * 86_400,
        }
    )
    assert spec.base_url == "https://api.example.com:8443/v1"
    assert RunSpec.model_validate(SPEC | {"base_url": "http://[::1]:8000"}).base_url


@pytest.fixture
def api(db_url: str) -> Iterator[Api]:
    with api_client(db_url) as a:
        yield a


def _runs(api: Api) -> int:
    with api.sessions() as s:
        return int(s.scalar(select(func.count()).select_from(Run)) or 0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("base_url", "http://127.0.0.1:9\r\nX-Injected: 1"),
        ("base_url", f"http://user:{KEY}@127.0.0.1:9"),
        ("metrics_url", f"http://u:{KEY}@127.0.0.1:9/metrics"),
        ("api_key", KEY + "\r\nX-Injected: 1"),
        ("request_timeout_s", 1e300),
        ("max_duration_s", 1e300),
    ],
)
def test_api_refuses_with_422_naming_the_field_and_stores_nothing(
    api: Api, field: str, value: Any
) -> None:
    for path in ("/api/v1/runs", "/api/v1/sweeps"):
        body = SPEC | {field: value} | ({"rates": [1.0]} if "sweeps" in path else {})
        r = api.client.post(path, json=body, headers=api.h(api.run))
        assert r.status_code == 422, (path, r.status_code, r.text[:300])
        assert r.json()["detail"][0]["loc"][-1] == field, r.text[:300]
        assert KEY not in r.text  # a key, even a bad one, is never echoed back
    assert _runs(api) == 0


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--base-url", "http://127.0.0.1:9\r\nX: 1"], "--base-url"),
        (["--base-url", f"http://u:{KEY}@127.0.0.1:9"], "--base-url"),
        (["--api-key", KEY + "\n"], "--api-key"),
        (["--request-timeout", "1e9"], "--request-timeout"),
        (["--max-duration", "1e300"], "--max-duration"),
    ],
)
def test_cli_exits_2_with_one_line_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], flag: str
) -> None:
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    base = ["bench", "--model", "m", "--database-url", db, "--num-prompts", "1"]
    if "--base-url" not in args:
        base += ["--base-url", "http://127.0.0.1:9"]
    assert main(base + args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0], err
    assert KEY not in err[0]
