"""Issue 16 in headless Chromium: the run and sweep forms show only the chosen dataset
type's own option fields (static/dataset-options.js), switch groups when the dataset
changes, keep a bad value beside its message after the post, and queue a run whose spec
holds the typed options; no console errors or CSP violations."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app.client.datasets import DATASETS
from app.services import auth
from app.services.runs import open_database
from app.storage import repository as repo
from app.storage.db import session_scope
from tests.browser_support import (
    CHROMIUM,
    Console,
    DashboardServer,
    browser_missing,
    sign_in,
)

pytestmark = pytest.mark.slow
_MISSING = browser_missing()
if _MISSING:
    pytest.skip(f"browser tests skipped: {_MISSING}", allow_module_level=True)

from playwright.sync_api import Browser, Page, sync_playwright  # noqa: E402


@dataclass(frozen=True)
class Lab:
    sessions: sessionmaker[Session]
    secret: str


@pytest.fixture(scope="module")
def lab_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Lab, DashboardServer]]:
    tmp = tmp_path_factory.mktemp("dataset-options")
    url = f"sqlite:///{tmp / 'forms.db'}"
    sessions = open_database(url)
    with session_scope(sessions) as s:
        _, secret = auth.create_token(s, scopes=["run"], name="browser")
    srv = DashboardServer(url, tmp / "server.log", local_worker=False)
    yield Lab(sessions, secret), srv
    srv.stop()


@pytest.fixture(scope="module")
def browser(lab_server: tuple[Lab, DashboardServer]) -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    yield pg
    ctx.close()


def _shown(page: Page) -> list[str]:
    """The dataset types whose option group is visible."""
    return [name for name in DATASETS if page.locator(f"#dataset-options-{name}").is_visible()]


@pytest.mark.parametrize("path", ["/launch", "/launch/sweep"])
def test_choosing_a_dataset_shows_only_its_options(
    page: Page, lab_server: tuple[Lab, DashboardServer], path: str
) -> None:
    lab, server = lab_server
    con = Console(page)
    sign_in(page, server, lab.secret, path)
    page.wait_for_selector("body[data-dataset-options=ready]")
    assert page.input_value("#f-dataset") == "random"
    assert _shown(page) == ["random"]
    assert page.locator("#f-opt-random-range_ratio").is_visible()
    assert not page.locator("#dataset-options-note").is_visible()  # only without JS
    for name in ("mooncake", "prefix_repetition", "jsonl", "timed_jsonl", "random-mm"):
        page.select_option("#f-dataset", name)
        assert _shown(page) == [name], name
    assert page.input_value("#f-opt-random-mm-image_size") == "512x512"  # a text option
    page.select_option("#f-dataset", "sharegpt")
    assert _shown(page) == ["sharegpt"]
    assert page.locator("#f-opt-sharegpt-max_prompt_len").is_visible()
    assert not page.locator("#f-opt-random-range_ratio").is_visible()
    assert page.get_attribute("#f-opt-sharegpt-max_prompt_len", "type") == "number"
    assert page.get_attribute("#f-opt-sharegpt-max_prompt_len", "min") == "1"
    assert con.problems() == []


@pytest.mark.parametrize("path", ["/launch", "/launch/sweep"])
def test_choosing_an_endpoint_shows_only_its_options(
    page: Page, lab_server: tuple[Lab, DashboardServer], path: str
) -> None:
    """The endpoints' own options (issue 25) follow the endpoint select the same way."""
    lab, server = lab_server
    con = Console(page)
    sign_in(page, server, lab.secret, path)
    page.wait_for_selector("body[data-dataset-options=ready]")
    groups = ("embeddings", "rerank")  # chat and completions have no options of their own

    def shown() -> list[str]:
        return [e for e in groups if page.locator(f"#endpoint-options-{e}").is_visible()]

    assert page.input_value("#f-endpoint") == "chat" and shown() == []
    page.select_option("#f-endpoint", "embeddings")
    assert shown() == ["embeddings"]
    assert page.get_attribute("#f-eopt-embeddings-batch_size", "min") == "1"
    page.select_option("#f-endpoint", "rerank")
    assert shown() == ["rerank"] and page.locator("#f-eopt-rerank-rerank_api").is_visible()
    assert _shown(page) == ["random"]  # the dataset's group is left as it was
    assert con.problems() == []


def test_a_bad_option_comes_back_beside_its_input_then_the_run_is_queued(
    page: Page, lab_server: tuple[Lab, DashboardServer]
) -> None:
    lab, server = lab_server
    con = Console(page)
    sign_in(page, server, lab.secret, "/launch")
    page.fill("#f-base_url", "http://127.0.0.1:9")
    page.fill("#f-num_prompts", "4")
    page.select_option("#f-dataset", "prefix_repetition")
    page.fill("#f-opt-prefix_repetition-num_prefixes", "9")  # more prefixes than prompts
    page.fill("#f-opt-prefix_repetition-prefix_len", "32")
    with page.expect_navigation() as nav:
        page.click("#launch-submit")
    resp = nav.value
    assert resp is not None and resp.status == 422  # the form comes back refused ...
    assert con.errors == [  # ... which Chromium logs as a failed load: that line only
        "Failed to load resource: the server responded with a status of 422 (Unprocessable Entity)"
    ], con.errors
    con.errors.clear()
    err = page.locator("#err-opt-prefix_repetition-num_prefixes")
    assert err.is_visible() and "dataset_options.num_prefixes" in err.inner_text()
    assert _shown(page) == ["prefix_repetition"]
    assert page.input_value("#f-opt-prefix_repetition-num_prefixes") == "9"
    assert page.input_value("#f-opt-prefix_repetition-prefix_len") == "32"
    page.fill("#f-opt-prefix_repetition-num_prefixes", "2")
    with page.expect_navigation():
        page.click("#launch-submit")
    m = re.search(r"/runs/([0-9a-f]+)$", page.url)
    assert m, page.url
    with session_scope(lab.sessions) as s:
        spec = dict(repo.get_run(s, m.group(1)).spec or {})
    assert spec["dataset"] == "prefix_repetition"
    assert spec["dataset_options"] == {"num_prefixes": 2, "prefix_len": 32}
    assert con.problems() == []


def test_without_javascript_every_group_shows_labelled(
    browser: Browser, lab_server: tuple[Lab, DashboardServer]
) -> None:
    server = lab_server[1]
    ctx = browser.new_context(java_script_enabled=False)
    try:
        page = ctx.new_page()
        page.goto(f"{server.url}/launch")
        assert _shown(page) == list(DATASETS)
        for name in DATASETS:
            legend = page.locator(f"#dataset-options-{name} legend").inner_text()
            assert legend == f"{name} options"
        assert page.locator("#dataset-options-note").is_visible()
    finally:
        ctx.close()
