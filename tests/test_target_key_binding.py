"""A target key held by the machine that runs the load (``api_key_env``) goes only to the
targets its binding, ``TOKENTRACE_TARGET_KEY_<NAME>_TARGETS`` on that machine, lists
(issue 23, item 8: any run could make a worker send any of its keys to any listener). A run
to another target is refused before anything is sent, naming the key and the target; over
a real loopback listener the bearer never arrives there, and does arrive at a bound one.
The same rule on the CLI path and the worker path."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.cli.main import main
from app.client.execute import execute
from app.client.runner import run_load
from app.client.spec import RunSpec
from app.client.target_keys import key_may_reach, parse_binding, resolve_api_key
from tests.live_server import LiveServerFactory
from tests.target_listener import Listener
from tests.worker_helpers import api, start_worker_process, submit, wait_job

VAR = "TOKENTRACE_TARGET_KEY_LAB"
BINDING = VAR + "_TARGETS"
KEY = "sk-lab-0123456789abcdef"
BEARER = f"Bearer {KEY}"


def _spec(base_url: str, **kw: object) -> RunSpec:
    fields: dict[str, object] = {
        "base_url": base_url, "model": "m", "num_prompts": 3, "input_len": 4, "output_len": 2,
        "max_concurrency": 1, "api_key_env": VAR,
    }  # fmt: skip
    return RunSpec.model_validate(fields | kw)


@pytest.mark.parametrize(
    ("binding", "url", "covered"),
    [
        ("127.0.0.1:8000", "http://127.0.0.1:8000", True),
        ("127.0.0.1:8000", "https://127.0.0.1:8000/v1", True),
        ("127.0.0.1:8000", "http://127.0.0.1:8001", False),
        ("127.0.0.1:8000", "http://localhost:8000", False),  # as written, no DNS
        ("[::1]:8000", "http://[::1]:8000/v1", True),
        ("https://api.example.com", "https://api.example.com/v1", True),
        ("https://api.example.com", "https://API.example.com:443/v1", True),
        ("https://api.example.com", "http://api.example.com/v1", False),  # scheme
        ("https://api.example.com", "https://api.example.com:8443/v1", False),  # port
        ("https://api.example.com", "https://api.example.com.evil.io/v1", False),
        ("https://api.example.com/v1", "https://api.example.com/v1", True),
        ("https://api.example.com/v1/", "https://api.example.com/v1/chat", True),
        ("https://api.example.com/v1", "https://api.example.com/v10", False),
        ("https://api.example.com/v1", "https://api.example.com/metrics", False),
        ("http://a:1, b.example:2", "http://b.example:2/x", True),
    ],
)
def test_binding_covers(binding: str, url: str, covered: bool) -> None:
    rules = parse_binding(BINDING, binding)
    assert any(r.covers(url) for r in rules) is covered


@pytest.mark.parametrize(
    "entry", ["api.example.com", "ftp://h:1", "https://u:p@h", "h:notaport", "h:1/path", "*"]
)
def test_a_bad_binding_entry_is_named(entry: str) -> None:
    with pytest.raises(ValueError, match=f"{BINDING}: '.*' is not a target"):
        parse_binding(BINDING, entry)


def test_a_key_without_a_binding_or_bound_elsewhere_is_refused() -> None:
    spec = _spec("http://127.0.0.1:9")
    with pytest.raises(ValueError, match=f"{VAR} is not bound to any target.*set {BINDING}"):
        resolve_api_key(spec, {VAR: KEY})
    with pytest.raises(ValueError) as e:
        resolve_api_key(spec, {VAR: KEY, BINDING: "127.0.0.1:8"})
    assert f"{VAR} may not be sent to http://127.0.0.1:9" in str(e.value)
    assert KEY not in str(e.value)
    with pytest.raises(ValueError, match=f"{VAR}: a key must be visible ASCII"):
        resolve_api_key(spec, {VAR: KEY + "\r\nX: 1", BINDING: "127.0.0.1:9"})
    bound = resolve_api_key(spec, {VAR: KEY, BINDING: "127.0.0.1:9"})
    assert bound.api_key == KEY and "api_key" not in bound.model_dump()


def test_execute_sends_the_key_only_to_its_bound_target(monkeypatch: pytest.MonkeyPatch) -> None:
    with Listener() as bound, Listener() as other:
        monkeypatch.setenv(VAR, KEY)
        monkeypatch.setenv(BINDING, f"127.0.0.1:{bound.port}")

        unbound = _spec(other.url)
        refused = asyncio.run(execute(unbound, lambda: run_load(unbound, run_tag="o")))
        assert refused.result is None and refused.error is not None
        assert f"{VAR} may not be sent to {other.url}" in str(refused.error)
        assert other.requests() == []  # nothing at all reached it: no model list, no scrape

        ok = asyncio.run(execute(_spec(bound.url), lambda: run_load(_spec(bound.url), run_tag="b")))
        assert ok.result is not None and ok.result.counts["ok"] == 3, ok.error
        seen = bound.requests()
        paths = {s.path for s in seen}
        assert "/v1/chat/completions" in paths and "/v1/models" in paths and "/metrics" in paths
        assert bound.bearers() == {BEARER}  # requests, model list and scrape (same host:port)


def test_the_scrape_gets_the_key_only_where_the_binding_covers_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with Listener() as target:
        monkeypatch.setenv(VAR, KEY)
        monkeypatch.setenv(BINDING, f"{target.url}/v1")  # the API's path, not /metrics
        spec = _spec(target.url + "/v1")
        assert not key_may_reach(spec, target.url + "/metrics")
        done = asyncio.run(execute(spec, lambda: run_load(spec, run_tag="s")))
        assert done.result is not None and done.result.counts["ok"] == 3, done.error
        by_path = {s.path: s.authorization for s in target.requests()}
        assert by_path["/v1/chat/completions"] == BEARER and by_path["/v1/models"] == BEARER
        assert by_path["/metrics"] is None


def test_run_load_alone_refuses_too(monkeypatch: pytest.MonkeyPatch) -> None:
    with Listener() as other:
        monkeypatch.setenv(VAR, KEY)
        monkeypatch.setenv(BINDING, "127.0.0.1:1")
        with pytest.raises(ValueError, match=f"{VAR} may not be sent to"):
            asyncio.run(run_load(_spec(other.url), run_tag="x"))
        assert other.requests() == []


def test_cli_refuses_an_unbound_target_with_exit_2_and_sends_to_a_bound_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with Listener() as bound, Listener() as other:
        monkeypatch.setenv(VAR, KEY)
        monkeypatch.setenv(BINDING, bound.url)
        base = ["bench", "--model", "m", "--num-prompts", "2", "--input-len", "4",
                "--output-len", "2", "--api-key-env", VAR, "--no-save"]  # fmt: skip
        assert main([*base, "--base-url", other.url]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--api-key-env: {VAR} may not be sent to {other.url}" in err[0]
        sweep = ["sweep", "--model", "m", "--num-prompts", "2", "--api-key-env", VAR, "--rates",
                 "1", "--database-url", f"sqlite:///{tmp_path / 's.db'}"]  # fmt: skip
        assert main([*sweep, "--base-url", other.url]) == 2  # a local sweep: the same rule
        assert f"--api-key-env: {VAR} may not be sent to" in capsys.readouterr().err
        assert other.requests() == []
        monkeypatch.delenv(BINDING)
        assert main([*base, "--base-url", bound.url]) == 2  # no binding at all
        assert f"set {BINDING}" in capsys.readouterr().err
        monkeypatch.setenv(BINDING, bound.url)
        assert main([*base, "--base-url", bound.url, "--json"]) == 0
        assert bound.bearers() == {BEARER}


@pytest.mark.slow
def test_worker_refuses_an_unbound_target_and_sends_to_a_bound_one(
    live_server: LiveServerFactory, sqlite_url: str, tmp_path: Path
) -> None:
    srv = live_server(sqlite_url)
    with Listener() as bound, Listener() as other:
        env = {VAR: KEY, BINDING: f"{bound.url}, 10.9.9.9:1"}
        worker = start_worker_process(srv.url, srv.worker_token, tmp_path / "state", env=env)
        try:
            with api(srv) as c:
                small = {"model": "m", "num_prompts": 3, "input_len": 4, "output_len": 2,
                         "api_key_env": VAR}  # fmt: skip
                _, refused_job = submit(c, small | {"base_url": other.url})
                _, ok_job = submit(c, small | {"base_url": bound.url})
                refused = wait_job(c, refused_job, ("succeeded", "failed", "cancelled"), 60)
                done = wait_job(c, ok_job, ("succeeded", "failed", "cancelled"), 60)
        finally:
            worker.terminate()
            worker.wait(20)
    assert refused["state"] == "failed", refused
    assert f"{VAR} may not be sent to {other.url}" in refused["error"]
    assert KEY not in refused["error"]
    assert other.requests() == []
    assert done["state"] == "succeeded", done
    assert bound.bearers() == {BEARER}
