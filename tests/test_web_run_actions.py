"""Run page actions over HTTP (TestClient): tags, note, baseline and pin, cancel, delete.
Each needs the run scope, the CSRF token and this site's Origin; bad input shows a message
beside the field and changes nothing."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.client.spec import RunSpec
from app.protocol.wire import JobRequirements
from app.services import auth, bench_jobs
from app.services.file_imports import import_path
from app.storage import compare_repo
from app.storage import jobs as job_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from tests.web_support import CSV_LOG, Seeded, csrf_of, seed, sign_in, web_app


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Seeded:
    return seed(tmp_path_factory.mktemp("actions"))


def _token(seeded: Seeded, *scopes: str) -> str:
    with session_scope(seeded.sessions) as s:
        _, secret = auth.create_token(s, scopes=list(scopes), name="actions-test")
    return secret


@pytest.fixture(scope="module")
def client(seeded: Seeded) -> Iterator[TestClient]:
    with TestClient(web_app(seeded.url)) as c:
        assert sign_in(c, _token(seeded, "run")).status_code == 303
        yield c


def _post(c: TestClient, path: str, data: dict[str, Any], **kw: Any) -> Any:
    """A form post from the run page itself: its CSRF token and this site's Origin."""
    headers = {"Origin": str(c.base_url).rstrip("/")} | kw.pop("headers", {})
    token = kw.pop("csrf", None)
    body = data | {"csrf": csrf_of(c, "/") if token is None else token}
    return c.post(path, data=body, headers=headers, follow_redirects=False, **kw)


def _run(seeded: Seeded, run_id: str) -> Any:
    with session_scope(seeded.sessions) as s:
        row = repo.find_run(s, run_id)
        if row is None:
            return None
        return {"tags": list(row.tags), "note": row.note, "status": str(row.status)}


def _imported(seeded: Seeded, tmp_path: Path, name: str) -> str:
    f = tmp_path / f"{name}.csv"
    f.write_text(CSV_LOG)
    return import_path(seeded.sessions, "csv", f, name=name)[0]


def test_tags_saved_then_shown_on_the_page_and_in_the_list_filter(
    client: TestClient, seeded: Seeded, tmp_path: Path
) -> None:
    run_id = _imported(seeded, tmp_path, "tag-me")
    r = _post(client, f"/runs/{run_id}/tags", {"tags": " nightly, a100 ,nightly"})
    assert r.status_code == 303
    assert r.headers["location"] == f"/runs/{run_id}?done=tags#actions"
    assert _run(seeded, run_id)["tags"] == ["nightly", "a100"]  # trimmed, de-duplicated
    page = client.get(r.headers["location"]).text
    assert 'id="flash"' in page and "Tags saved." in page
    assert '<a class="tag" href="/?tag=nightly">nightly</a>' in page
    assert 'value="nightly, a100"' in page  # the form shows the saved tags
    listed = client.get("/?tag=a100").text
    assert f'data-run-id="{run_id}"' in listed and f'data-run-id="{seeded.one}"' not in listed
    assert _post(client, f"/runs/{run_id}/tags", {"tags": ""}).status_code == 303
    assert _run(seeded, run_id)["tags"] == []  # blank removes them


def test_too_long_tag_is_named_and_changes_nothing(client: TestClient, seeded: Seeded) -> None:
    before = _run(seeded, seeded.normal)
    r = _post(client, f"/runs/{seeded.normal}/tags", {"tags": "ok, " + "x" * 101})
    assert r.status_code == 422
    m = re.search(r'id="err-tags">([^<]*)<', r.text)
    assert m and "tags:" in m.group(1) and "longer than 100 characters" in m.group(1)
    assert "x" * 101 in r.text  # what was typed is shown again to fix
    assert _run(seeded, seeded.normal) == before
    many = ", ".join(f"t{i}" for i in range(101))
    r = _post(client, f"/runs/{seeded.normal}/tags", {"tags": many})
    assert r.status_code == 422 and "at most 100 tags" in r.text
    assert _run(seeded, seeded.normal) == before


def test_note_saved_and_cleared(client: TestClient, seeded: Seeded, tmp_path: Path) -> None:
    run_id = _imported(seeded, tmp_path, "note-me")
    r = _post(client, f"/runs/{run_id}/note", {"note": "  driver 550 <b>bold</b> "})
    assert r.status_code == 303 and r.headers["location"].endswith("?done=note#actions")
    assert _run(seeded, run_id)["note"] == "driver 550 <b>bold</b>"
    page = client.get(f"/runs/{run_id}?done=note").text
    assert '<p class="note" id="run-note">driver 550 &lt;b&gt;bold&lt;/b&gt;</p>' in page
    assert "Note saved." in page
    r = _post(client, f"/runs/{run_id}/note", {"note": "x" * 100_001})
    assert r.status_code == 422 and 'id="err-note"' in r.text
    assert _run(seeded, run_id)["note"] == "driver 550 <b>bold</b>"
    assert _post(client, f"/runs/{run_id}/note", {"note": "   "}).status_code == 303
    assert _run(seeded, run_id)["note"] is None


def _baselines(seeded: Seeded, name: str) -> list[tuple[int, str | None, bool]]:
    with session_scope(seeded.sessions) as s:
        return [(b.version, b.run_id, b.pinned) for b in compare_repo.baseline_history(s, name)]


def test_baseline_saved_pinned_unpinned_and_shown(client: TestClient, seeded: Seeded) -> None:
    r = _post(client, f"/runs/{seeded.one}/baseline", {"baseline_name": "   "})
    assert r.status_code == 422
    m = re.search(r'id="err-baseline_name">([^<]*)<', r.text)
    assert m and "baseline name:" in m.group(1) and "1 to 255 characters" in m.group(1)
    r = _post(client, f"/runs/{seeded.one}/baseline", {"baseline_name": "n" * 256})
    assert r.status_code == 422 and 'id="err-baseline_name"' in r.text
    with session_scope(seeded.sessions) as s:
        assert compare_repo.list_baselines(s) == []
    r = _post(client, f"/runs/{seeded.one}/baseline", {"baseline_name": "prod-a", "pin": "1"})
    assert r.status_code == 303 and r.headers["location"].endswith("?done=baseline#actions")
    assert _baselines(seeded, "prod-a") == [(1, seeded.one, True)]
    page = client.get(f"/runs/{seeded.one}").text
    row = re.search(r'<tr data-baseline="prod-a">(.*?)</tr>', page, re.S)
    assert row and "version 1" in row.group(1) and ">pinned<" in row.group(1)
    # pinned: another run cannot take the name; the message is beside the name field
    r = _post(client, f"/runs/{seeded.normal}/baseline", {"baseline_name": "prod-a"})
    assert r.status_code == 409
    assert re.search(r'id="err-baseline_name">[^<]*is pinned', r.text)
    assert _baselines(seeded, "prod-a") == [(1, seeded.one, True)]
    # unpin from the run page, then the name can move to another run
    r = _post(client, f"/runs/{seeded.one}/baseline-pin", {"name": "prod-a", "pinned": "0"})
    assert r.status_code == 303 and "done=unpinned" in r.headers["location"]
    assert _baselines(seeded, "prod-a") == [(1, seeded.one, False)]
    # only the run the baseline points at can pin it
    r = _post(client, f"/runs/{seeded.normal}/baseline-pin", {"name": "prod-a", "pinned": "1"})
    assert r.status_code == 422 and 'id="err-pin"' in r.text
    assert _baselines(seeded, "prod-a") == [(1, seeded.one, False)]
    assert 'value="prod-a"' in client.get("/compare").text  # offered on the compare page


def test_cancel_queued_run_and_refuse_a_finished_one(client: TestClient, seeded: Seeded) -> None:
    r = _post(client, f"/runs/{seeded.one}/cancel", {})
    assert r.status_code == 409 and 'id="err-cancel"' in r.text
    assert _run(seeded, seeded.one)["status"] == "succeeded"
    spec = RunSpec(base_url="http://127.0.0.1:9", model="m", num_prompts=3)
    with session_scope(seeded.sessions) as s:
        run_id, job_id = bench_jobs.create_bench_run(
            s,
            spec,
            requirements=JobRequirements(),
            name="queued",
            max_attempts=1,
            box=client.app.state.secretbox,  # type: ignore[attr-defined]
        )
    page = client.get(f"/runs/{run_id}").text
    assert 'id="live-cancel"' in page and 'id="live-figures"' in page
    r = _post(client, f"/runs/{run_id}/cancel", {})
    assert r.status_code == 303 and "done=cancelled" in r.headers["location"]
    assert _run(seeded, run_id)["status"] == "cancelled"
    with session_scope(seeded.sessions) as s:
        job = job_repo.get_job(s, job_id)
        assert job is not None and job.state == "cancelled"
    assert "Run cancelled." in client.get(r.headers["location"]).text


def test_delete_needs_the_confirmation(client: TestClient, seeded: Seeded, tmp_path: Path) -> None:
    run_id = _imported(seeded, tmp_path, "delete-me")
    page = client.get(f"/runs/{run_id}/delete")
    assert page.status_code == 200 and 'id="delete-form"' in page.text
    assert "3 stored requests" in page.text
    r = _post(client, f"/runs/{run_id}/delete", {"confirm": "yes"})
    assert r.status_code == 422 and 'id="err-confirm"' in r.text
    assert "type &#39;delete&#39;" in r.text
    assert _run(seeded, run_id) is not None
    r = _post(client, f"/runs/{run_id}/delete", {"confirm": "delete"})
    assert r.status_code == 303 and r.headers["location"] == f"/?deleted={run_id}"
    assert _run(seeded, run_id) is None
    listed = client.get(r.headers["location"]).text
    assert f"Run {run_id} deleted." in listed and f'data-run-id="{run_id}"' not in listed
    assert client.get(f"/runs/{run_id}/delete").status_code == 404


@pytest.mark.parametrize(
    ("path", "data"),
    [
        ("tags", {"tags": "evil"}),
        ("note", {"note": "evil"}),
        ("baseline", {"baseline_name": "evil"}),
        ("delete", {"confirm": "delete"}),
        ("cancel", {}),
    ],
)
def test_actions_refused_without_scope_csrf_or_origin(
    seeded: Seeded, path: str, data: dict[str, str]
) -> None:
    run_id = seeded.normal
    before = _run(seeded, run_id)
    with session_scope(seeded.sessions) as s:
        n_baselines = len(compare_repo.list_baselines(s))
    with TestClient(web_app(seeded.url)) as anon:  # signed out
        r = _post(anon, f"/runs/{run_id}/{path}", data)
        assert r.status_code == 403 and "&#39;run&#39; scope" in r.text
    with TestClient(web_app(seeded.url)) as reader:  # a read-only token
        assert sign_in(reader, _token(seeded, "read")).status_code == 303
        r = _post(reader, f"/runs/{run_id}/{path}", data)
        assert r.status_code == 403 and "&#39;run&#39; scope" in r.text
        assert 'id="tags-form"' not in reader.get(f"/runs/{run_id}").text
    with TestClient(web_app(seeded.url)) as runner:
        assert sign_in(runner, _token(seeded, "run")).status_code == 303
        r = _post(runner, f"/runs/{run_id}/{path}", data, csrf="forged")
        assert r.status_code == 403 and "CSRF" in r.text
        r = _post(runner, f"/runs/{run_id}/{path}", data, headers={"Origin": "http://evil"})
        assert r.status_code == 403 and "CSRF" in r.text
    assert _run(seeded, run_id) == before
    with session_scope(seeded.sessions) as s:
        assert len(compare_repo.list_baselines(s)) == n_baselines


def test_actions_on_a_missing_run_are_404(client: TestClient) -> None:
    for path in ("tags", "note", "baseline", "cancel", "delete"):
        assert _post(client, f"/runs/nope/{path}", {"confirm": "delete"}).status_code == 404


def test_delete_of_a_run_a_worker_runs_is_refused(client: TestClient, seeded: Seeded) -> None:
    spec = RunSpec(base_url="http://127.0.0.1:9", model="m", num_prompts=3)
    with session_scope(seeded.sessions) as s:
        run_id, job_id = bench_jobs.create_bench_run(
            s,
            spec,
            requirements=JobRequirements(),
            name="on a worker",
            max_attempts=1,
            box=client.app.state.secretbox,  # type: ignore[attr-defined]
        )
        assert job_repo.transition(s, job_id, from_states=("queued",), state="running")
    r = _post(client, f"/runs/{run_id}/delete", {"confirm": "delete"})
    assert r.status_code == 409
    m = re.search(r'id="err-confirm">([^<]*)<', r.text)
    assert m and "cancel it first" in m.group(1)
    assert _run(seeded, run_id) is not None
    r = _post(client, f"/runs/{run_id}/cancel", {})  # flagged: the worker stops it
    assert r.status_code == 303 and "done=cancel-requested" in r.headers["location"]
    with session_scope(seeded.sessions) as s:
        job = job_repo.get_job(s, job_id)
        assert job is not None and job.cancel_requested and job.state == "running"
