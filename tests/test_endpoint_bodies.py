"""Chat and completions request bodies, byte for byte as before the endpoint registry:
``fixtures/endpoints/bodies_before.json`` holds the bodies ``request_body`` built (captured
from the code before the move, every option combination it took), and each surface's module
must build the same bytes from the same inputs; the paths are the same too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.client.http_request import parse_target
from tests.endpoint_support import body_of, path_of

CASES: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "fixtures" / "endpoints" / "bodies_before.json").read_text()
)


def test_the_fixture_covers_every_option() -> None:
    kws = [c["kwargs"] for c in CASES]
    assert {k["endpoint"] for k in kws} == {"chat", "completions"}
    for key in ("ignore_eos", "stream"):
        assert {k[key] for k in kws} == {True, False}
    assert any(k["messages"] for k in kws) and any(k["extra_body"] for k in kws)
    assert len(CASES) == 96


@pytest.mark.parametrize("i", range(len(CASES)))
def test_bodies_are_byte_identical(i: int) -> None:
    kw = dict(CASES[i]["kwargs"])
    endpoint = kw.pop("endpoint")
    assert body_of(endpoint, **kw) == CASES[i]["body"].encode(), kw


@pytest.mark.parametrize(
    ("base", "chat", "completions"),
    [
        ("http://h:1", "/v1/chat/completions", "/v1/completions"),
        ("http://h:1/", "/v1/chat/completions", "/v1/completions"),
        ("http://h:1/v1", "/v1/chat/completions", "/v1/completions"),
        ("http://h:1/proxy", "/proxy/v1/chat/completions", "/proxy/v1/completions"),
        ("http://h:1/proxy/v1", "/proxy/v1/chat/completions", "/proxy/v1/completions"),
    ],
)
def test_paths_as_before(base: str, chat: str, completions: str) -> None:
    target = parse_target(base)
    assert path_of(target, "chat") == chat
    assert path_of(target, "completions") == completions
