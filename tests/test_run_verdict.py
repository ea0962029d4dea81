"""Issue 24 item 9: one verdict word per run, the same on every surface and consistent with
every banner: the runs list, the run page's validity card and banners, the API (list and
report), ``tokentrace runs`` / ``report``, the trust issues compare and sweeps read.

The runs are stored through the real paths (``tests/states_support.py``); the expected word
for each situation is written there by hand, from the rule (not by the verdict function)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient
from rich.console import Console
from sqlalchemy.orm import Session, sessionmaker

from app.analysis.verdict import RunFacts, run_trust_issues, run_verdict
from app.cli.render import render_report, render_runs
from app.services.runs import list_runs, open_database
from app.storage import repository as repo
from app.storage.db import session_scope
from app.web import runs_view
from tests.states_support import SITUATIONS
from tests.states_support import seed_situations as seed
from tests.web_support import web_app


@dataclass(frozen=True)
class Lab:
    url: str
    sessions: sessionmaker[Session]
    ids: dict[str, str]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Lab:
    tmp = tmp_path_factory.mktemp("verdicts")
    url = f"sqlite:///{tmp / 'v.db'}"
    sessions = open_database(url)
    return Lab(url, sessions, seed(sessions, tmp))


@pytest.fixture(scope="module")
def client(lab: Lab) -> Iterator[TestClient]:
    with TestClient(web_app(lab.url)) as c:
        yield c


def _cell(html: str, run_id: str) -> str:
    row = re.search(rf'<tr data-run-id="{run_id}">(.*?)</tr>', html, re.S)
    assert row is not None, run_id
    word = re.search(r'<span class="validity[^"]*"[^>]*>([^<]*)</span>', row.group(1))
    assert word is not None, row.group(1)
    return word.group(1)


def _card(html: str, which: str = "validity") -> tuple[str, str]:
    card = rf'<div class="card ([a-z]*)" id="card-{which}">.*?<div class="value">(.*?)</div>'
    m = re.search(card, html, re.S)
    assert m is not None
    return m.group(2), m.group(1)


def test_every_surface_shows_one_verdict(lab: Lab, client: TestClient) -> None:
    listing = client.get("/").text
    api_list = {r["id"]: r for r in client.get("/api/v1/runs?limit=100").json()["items"]}
    runs = {r["id"]: r for r in list_runs(lab.sessions, limit=100)}
    console = Console(record=True, width=300)
    render_runs(list(runs.values()), console)
    cli_rows = {ln.split("│")[1].strip(): ln for ln in console.export_text().splitlines()
                if ln.count("│") > 3}  # fmt: skip
    for sit in SITUATIONS:
        rid = lab.ids[sit.key]
        where = f"{sit.key} ({rid})"
        assert _cell(listing, rid) == sit.word, where
        assert api_list[rid]["verdict"] == sit.word, where
        assert runs[rid]["verdict"]["word"] == sit.word, where  # tokentrace runs --json
        assert f"│ {sit.word}" in cli_rows[rid], (where, cli_rows[rid])
        detail = client.get(f"/api/v1/runs/{rid}").json()
        validity = detail["report"]["validity"]
        assert validity["verdict"] == sit.word and validity["valid"] is sit.valid, where
        out = Console(record=True, width=300)
        render_report(detail["report"], out)
        assert f"verdict: {sit.word}\n" in out.export_text(), where
        page = client.get(f"/runs/{rid}").text
        word, tone = _card(page)
        assert word == sit.word, where
        bad = 'id="trust-warnings"' in page
        notice = 'id="run-notices"' in page
        assert (bad, notice) == (sit.banner == "bad", sit.banner == "warn"), where
        # the card's colour and the banner agree: never "valid" in green beside a warning
        assert (tone == "bad") == bad and (tone == "good") == (not bad and not notice), where
        # nor "succeeded" in green: an ended run's status card takes the verdict's colour
        if sit.word != "pending":
            assert _card(page, "status")[1] == tone, where
        # compare refuses, sweeps skip: exactly the runs that are not valid
        issues = run_trust_issues(runs[rid])
        assert bool(issues) == (not sit.valid), (where, issues)
        with session_scope(lab.sessions) as s:
            row = repo.get_run(s, rid)
            flagged = runs_view.run_warnings(row)
        assert bool(flagged) == (not sit.valid and sit.word != "pending"), where


def test_banners_say_why_in_the_verdicts_words(lab: Lab, client: TestClient) -> None:
    """The banner of each situation names its cause, with its counts (hand-computed)."""
    page = client.get(f"/runs/{lab.ids['over_bound']}").text
    warn = re.search(r'id="trust-warnings">(.*?)</section>', page, re.S)
    assert warn is not None and "error rate 16.7% (4 failed of 24 sent; bound 5%)" in warn.group(1)
    page = client.get(f"/runs/{lab.ids['lost_turns']}").text
    warn = re.search(r'id="trust-warnings">(.*?)</section>', page, re.S)
    assert warn is not None and "9 of 30 planned turns were never sent" in warn.group(1)
    page = client.get(f"/runs/{lab.ids['cancelled']}").text
    note = re.search(r'id="run-notices">(.*?)</section>', page, re.S)
    assert note is not None
    assert "16 of 100 planned requests completed; 4 in flight were cut" in note.group(1)
    assert 'id="diagnosis"' not in page  # no failure diagnosis for a cancel
    page = client.get(f"/runs/{lab.ids['all_failed']}").text
    warn = re.search(r'id="trust-warnings">(.*?)</section>', page, re.S)
    assert warn is not None
    assert "no measured request succeeded (5 failed of 5 sent)" in warn.group(1)


@pytest.mark.parametrize(
    ("facts", "word", "tone"),
    [
        (RunFacts("r", "succeeded", sent=10, ok=10, failed=0, error_rate=0.0), "valid", "good"),
        (RunFacts("r", "queued"), "pending", ""),
        (RunFacts("r", "running", sent=3, ok=3, failed=0), "pending", ""),
        (RunFacts("r", "failed", sent=4, ok=0, failed=4, error_rate=1.0), "failed", "bad"),
        # every request cut by the client and the run not cancelled (its time limit): failed
        (
            RunFacts("r", "failed", sent=4, ok=0, failed=0, cancelled=4, error_rate=0.0),
            "failed",
            "bad",
        ),
        # cancelled before anything completed: cancelled, not failed
        (
            RunFacts("r", "cancelled", sent=4, ok=0, failed=0, cancelled=4, error_rate=0.0),
            "cancelled",
            "warn",
        ),
        (RunFacts("r", "cancelled", sent=0, ok=0, failed=0), "cancelled", "warn"),
        # a cancelled run that also lost requests: the untrusted cause comes first
        (
            RunFacts("r", "cancelled", sent=10, ok=8, failed=0, cancelled=2, lost=3),
            "incomplete",
            "bad",
        ),
        (RunFacts("r", "partial", sent=10, ok=10, failed=0, error_rate=0.0), "partial", "bad"),
        (RunFacts("r", "succeeded", sent=0, ok=0, failed=0), "no data", "bad"),
        (
            RunFacts("r", "succeeded", sent=3, ok=3, failed=0, summary_only=True),
            "summary-only",
            "good",
        ),
        # 1 of 20 = 5%: at the bound is within it; 2 of 20 over it
        (RunFacts("r", "succeeded", sent=20, ok=19, failed=1, error_rate=0.05), "valid", "good"),
        (
            RunFacts("r", "partial", sent=20, ok=18, failed=2, error_rate=0.1),
            "over error bound",
            "bad",
        ),
    ],
)
def test_verdict_rule_table(facts: RunFacts, word: str, tone: str) -> None:
    v = run_verdict(facts)
    assert (v.word, v.tone) == (word, tone)
    assert v.valid == (word in ("valid", "summary-only"))
    # the word is the first issue's, and the tone the worst issue's
    assert (v.issues[0].word if v.issues else "valid") == word
    if v.untrusted:
        assert tone == "bad"
