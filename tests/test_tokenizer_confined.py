"""A run's ``tokenizer`` path on a worker reads only a tokenizer inside the worker's dataset
directories, as ``dataset_path`` does (issue 23, item 8: it read any file the worker could).
Each refusal reads the same, names the field, and comes before anything is sent; the local
CLI (no directories) still reads its own files."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest

from app.client.runner import run_load
from app.client.spec import RunSpec
from app.client.tokenizer import REFUSED, HFTokenizer, load_tokenizer
from tests.live_server import LiveServerFactory
from tests.target_listener import Listener
from tests.worker_helpers import api, start_worker_process, submit, wait_job


def _write_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "the": 1, "end": 2}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    """(allowed, outside): a tokenizer folder in each."""
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    for d in (allowed / "model", outside / "model"):
        d.mkdir(parents=True)
        _write_tokenizer(d / "tokenizer.json")
    return allowed, outside


def test_a_tokenizer_inside_the_directories_loads(dirs: tuple[Path, Path]) -> None:
    allowed, _ = dirs
    for path in (allowed / "model", allowed / "model" / "tokenizer.json"):
        tok = load_tokenizer(str(path), [str(allowed)])
        assert isinstance(tok, HFTokenizer) and tok.count("the end the") == 3


def test_everything_else_is_refused_alike(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    allowed, outside = dirs
    (allowed / "escape").symlink_to(outside / "model")  # a folder link out
    (allowed / "file-link.json").symlink_to(outside / "model" / "tokenizer.json")
    (allowed / "inner").mkdir()
    (allowed / "inner" / "tokenizer.json").symlink_to(outside / "model" / "tokenizer.json")
    os.mkfifo(allowed / "fifo.json")  # would block a plain open
    (allowed / "notes.txt").write_text("not a tokenizer")
    (allowed / "empty").mkdir()
    for path in [
        outside / "model",
        outside / "model" / "tokenizer.json",
        allowed / ".." / "outside" / "model",
        allowed / "escape",
        allowed / "file-link.json",
        allowed / "inner",
        allowed / "fifo.json",
        allowed / "notes.txt",
        allowed / "empty",
        allowed / "missing",
        Path("/etc/passwd"),
        Path("/dev/zero"),
        Path("/proc/self/environ"),
    ]:
        with pytest.raises(ValueError) as e:
            load_tokenizer(str(path), [str(allowed)])
        assert str(e.value) == REFUSED, (path, e.value)
    with pytest.raises(ValueError, match=re.escape(REFUSED)):  # a worker with no dirs: nowhere
        load_tokenizer(str(allowed / "model"), [])


def test_the_local_cli_reads_its_own_files_and_says_what_is_wrong(
    dirs: tuple[Path, Path],
) -> None:
    _, outside = dirs
    assert load_tokenizer(str(outside / "model"), None).count("the") == 1
    with pytest.raises(ValueError, match=r"tokenizer: .* is not a Hugging Face tokenizer\.json"):
        load_tokenizer("/etc/hostname", None)
    with pytest.raises(ValueError, match=r"tokenizer: no tokenizer\.json at"):
        load_tokenizer(str(outside), None)


def test_run_load_refuses_before_sending(dirs: tuple[Path, Path]) -> None:
    allowed, outside = dirs
    with Listener() as target:
        spec = RunSpec(base_url=target.url, model="m", num_prompts=2, input_len=4, output_len=2,
                       tokenizer=str(outside / "model"), scrape_metrics=False)  # fmt: skip
        with pytest.raises(ValueError, match=r"^tokenizer: "):
            asyncio.run(run_load(spec, run_tag="t", dataset_dirs=[str(allowed)]))
        assert target.requests() == []
        inside = spec.model_copy(update={"tokenizer": str(allowed / "model")})
        res = asyncio.run(run_load(inside, run_tag="t", dataset_dirs=[str(allowed)]))
        assert res.counts["ok"] == 2


@pytest.mark.slow
def test_a_worker_job_naming_a_file_outside_fails_naming_the_field(
    live_server: LiveServerFactory, sqlite_url: str, tmp_path: Path, dirs: tuple[Path, Path]
) -> None:
    allowed, _ = dirs
    srv = live_server(sqlite_url)
    worker = start_worker_process(
        srv.url, srv.worker_token, tmp_path / "state", "--dataset-dir", str(allowed)
    )
    try:
        with Listener() as target, api(srv) as c:
            small = {"base_url": target.url, "model": "m", "num_prompts": 2, "input_len": 4,
                     "output_len": 2, "scrape_metrics": False}  # fmt: skip
            _, bad = submit(c, small | {"tokenizer": "/etc/passwd"})
            _, good = submit(c, small | {"tokenizer": str(allowed / "model")})
            ends = ("succeeded", "failed", "cancelled")
            refused, done = wait_job(c, bad, ends, 60), wait_job(c, good, ends, 60)
            seen = target.requests()
    finally:
        worker.terminate()
        worker.wait(20)
    assert refused["state"] == "failed" and REFUSED in refused["error"], refused
    assert "root:" not in refused["error"]
    assert done["state"] == "succeeded", done
    assert len([s for s in seen if s.method == "POST"]) == 2  # only the good job's requests
