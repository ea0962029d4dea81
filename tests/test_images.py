"""Images in chat prompts (issue 25 part 5): image parts from files a JSONL line names (read
from the worker's dataset directories as ``dataset_path`` is, typed by their magic bytes,
bounded) and the synthetic dataset ``random-mm`` (seeded noise PNGs, written with zlib
alone). Prompt tokens are the server's (the simulator counts ``image_tokens`` an image);
where a request's are not, the run says its images are not counted. What cannot take
images is refused at launch, naming the fields, before anything is sent. The PNGs are
decoded here by an independent decoder (inflate, then PNG's unfiltering)."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from app.cli.main import main
from app.client.datasets import images as img
from app.client.datasets.base import DatasetError
from app.client.execute import run_meta
from app.client.runner import run_load
from app.client.spec import RunSpec
from app.client.tokenizer import BuiltinTokenizer
from app.client.workload import build_workload
from app.domain import RequestStatus
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread
from tests.api_support import api_client
from tests.target_listener import Listener
from tests.test_cli import _count_runs
from tests.test_client import run

JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(64)


def decode_png(data: bytes) -> np.ndarray[Any, Any]:
    """An 8-bit RGB PNG's pixels (height x width x 3): chunks and their CRCs checked, IDAT
    inflated, each scanline unfiltered by its filter type (None, Sub, Up, Average, Paeth)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n : pos + 12 + n])
        assert crc == zlib.crc32(kind + body), kind
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    assert header is not None and header[2:] == (8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    w, h = header[0], header[1]
    raw = zlib.decompress(idat)
    stride = w * 3
    assert len(raw) == h * (stride + 1)
    out = np.zeros((h, stride), np.int64)
    for y in range(h):
        f, line = raw[y * (stride + 1)], raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]
        prev = out[y - 1] if y else np.zeros(stride, np.int64)
        row = out[y]
        for x in range(stride):
            a = row[x - 3] if x >= 3 else 0
            b, c = prev[x], (prev[x - 3] if x >= 3 else 0)
            pred = {0: 0, 1: a, 2: b, 3: (a + b) // 2}.get(f)
            if pred is None:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            row[x] = (line[x] + pred) % 256
    return out.reshape(h, w, 3)


def _png_of(url: str) -> bytes:
    head, b64 = url.split(",", 1)
    assert head == "data:image/png;base64"
    return base64.b64decode(b64)


def spec(**kw: Any) -> RunSpec:
    base: dict[str, Any] = {
        "base_url": "http://127.0.0.1:9",
        "model": "sim",
        "dataset": "random-mm",
        "num_prompts": 3,
        "input_len": 6,
        "output_len": 3,
        "scrape_metrics": False,
    }
    return RunSpec(**(base | kw))


# ----------------------------------------------------------------------- the images


def test_noise_png_decodes_to_cells_of_seeded_noise() -> None:
    for w, h in ((33, 17), (8, 8), (1, 1), (20, 3)):
        data = img.noise_png(w, h, np.random.default_rng(4))
        px = decode_png(data)
        assert px.shape == (h, w, 3)
        # one colour per 8x8 cell, drawn from the seed: the same cells as the rng draws
        rng = np.random.default_rng(4)
        cells = rng.integers(0, 256, size=(-(-h // 8), -(-w // 8), 3), dtype=np.uint8)
        for y in range(h):
            for x in range(w):
                assert tuple(px[y, x]) == tuple(cells[y // 8, x // 8]), (w, h, x, y)
        assert data == img.noise_png(w, h, np.random.default_rng(4))  # deterministic bytes
        assert len(data) <= img.noise_png_bytes_bound(w, h)
    assert img.noise_png(64, 64, np.random.default_rng(1)) != img.noise_png(
        64, 64, np.random.default_rng(2)
    )
    big = img.noise_png(4096, 4096, np.random.default_rng(0))
    assert len(big) <= img.noise_png_bytes_bound(4096, 4096)


def test_the_sniffed_types() -> None:
    png = img.noise_png(2, 2, np.random.default_rng(0))
    assert img.sniff(png) == "image/png" and img.sniff(JPEG) == "image/jpeg"
    assert img.sniff(b"GIF89a....") == "image/gif"
    assert img.sniff(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == "image/webp"
    for other in (b"", b"%PDF-1.7", b"hello", b"\x89PN"):
        assert img.sniff(other) is None


# ----------------------------------------------------------------------- random-mm


def test_random_mm_builds_seeded_chat_prompts_with_images() -> None:
    s = spec(dataset_options={"image_count": 2, "image_size": "40x24"}, warmup_requests=2)
    w = build_workload(s, BuiltinTokenizer())
    assert len(w.measured) == 3 and len(w.warmup) == 2 and w.stats == {"images": 6}
    urls = []
    for p in w.measured:
        assert p.prompt is None and p.images == 2 and p.input_tokens == 6
        assert p.messages is not None and len(p.messages) == 1
        text, *parts = p.messages[0]["content"]
        assert text["type"] == "text" and BuiltinTokenizer().count(text["text"]) == 6
        assert [x["type"] for x in parts] == ["image_url", "image_url"]
        for x in parts:
            urls.append(x["image_url"]["url"])
            assert decode_png(_png_of(urls[-1])).shape == (24, 40, 3)
    assert len(set(urls)) == 6  # every image distinct
    # the measured prompts do not depend on the warm-up count; the seed changes them
    again = build_workload(spec(dataset_options={"image_count": 2, "image_size": "40x24"}),
                           BuiltinTokenizer())  # fmt: skip
    assert again.measured == w.measured
    other = build_workload(spec(dataset_options={"image_count": 2, "image_size": "40x24"},
                                seed=9), BuiltinTokenizer())  # fmt: skip
    assert other.measured[0].messages != w.measured[0].messages
    assert s.dataset_options == {"image_count": 2, "image_size": "40x24"}
    assert spec(dataset_options={"image_size": " 512x512"}).dataset_options == {}  # the default


@pytest.mark.parametrize(
    ("kw", "names"),
    [
        ({"endpoint": "completions"}, ("dataset", "'random-mm'", "endpoint", "'completions'")),
        ({"endpoint": "embeddings"}, ("dataset", "'random-mm'", "'embeddings'")),
        ({"endpoint": "rerank"}, ("'random-mm'", "'rerank'")),
        ({"dataset_options": {"image_size": "512"}}, ("dataset_options.image_size", "WIDTHx")),
        ({"dataset_options": {"image_size": "0x5"}}, ("dataset_options.image_size", "4096")),
        ({"dataset_options": {"image_size": "4097x10"}}, ("dataset_options.image_size", "4096")),
        ({"dataset_options": {"image_size": "99999999x1"}}, ("dataset_options.image_size",)),
        ({"dataset_options": {"image_count": 0}}, ("dataset_options.image_count",)),
        ({"dataset_options": {"image_count": 33}}, ("dataset_options.image_count",)),
        ({"dataset_options": {"colour": 1}}, ("dataset_options.colour",)),
        (
            {"num_prompts": 10_000, "dataset_options": {"image_size": "4096x4096"}},
            ("num_prompts", "dataset_options.image_size", "MiB"),
        ),
        ({"multi_turn": True}, ("multi_turn", "'random-mm'")),
    ],
)
def test_what_cannot_be_sent_is_refused_naming_the_fields(
    kw: dict[str, Any], names: tuple[str, ...]
) -> None:
    with pytest.raises(ValidationError) as e:
        spec(**kw)
    text = str(e.value)
    for name in names:
        assert name in text, (name, text)


def test_refused_at_launch_422_and_exit_2(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with api_client(db_url) as api:
        body = {"base_url": "http://127.0.0.1:9", "model": "m", "dataset": "random-mm"}
        for bad, says in (
            ({"endpoint": "completions"}, ("random-mm", "completions", "endpoint")),
            ({"dataset_options": {"image_size": "1x5000"}}, ("dataset_options.image_size",)),
        ):
            r = api.client.post("/api/v1/runs", json=body | bad, headers=api.h(api.run))
            assert r.status_code == 422, r.text
            for s in says:
                assert s in r.text, (s, r.text)
        listed = api.client.get("/api/v1/jobs", headers=api.h(api.admin))
        assert listed.status_code == 200 and listed.json()["items"] == []
    db = f"sqlite:///{tmp_path / 'c.db'}"
    base = ["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--database-url", db,
            "--dataset-name", "random-mm"]  # fmt: skip
    for extra, says in (
        (["--endpoint", "embeddings"], ("--dataset-name", "'embeddings'")),
        (["--image-size", "640x"], ("image-size", "WIDTHxHEIGHT")),
        (["--image-count", "100"], ("image-count",)),
    ):
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        for s in says:
            assert s in err[0], (s, err[0])
    assert _count_runs(db) == 0


# ----------------------------------------------------------------------- JSONL images


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    """(allowed, outside): an image in each; the allowed one holds the dataset files."""
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir()
    outside.mkdir()
    (allowed / "a.png").write_bytes(img.noise_png(16, 8, np.random.default_rng(1)))
    (allowed / "sub").mkdir()
    (allowed / "sub" / "b.jpg").write_bytes(JPEG)
    (outside / "c.png").write_bytes(img.noise_png(4, 4, np.random.default_rng(2)))
    (allowed / "link.png").symlink_to(outside / "c.png")
    (allowed / "notes.png").write_text("not an image at all")
    return allowed, outside


def _dataset(folder: Path, lines: list[dict[str, Any]]) -> str:
    path = folder / "d.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def test_jsonl_images_become_parts_of_the_user_message(dirs: tuple[Path, Path]) -> None:
    allowed, _ = dirs
    path = _dataset(allowed, [
        {"prompt": "what is in these", "images": ["a.png", "sub/b.jpg"]},
        {"messages": [{"role": "system", "content": "be brief"},
                      {"role": "user", "content": "and this one"}], "images": ["a.png"]},
    ])  # fmt: skip
    s = spec(dataset="jsonl", dataset_path=path, num_prompts=2)
    w = build_workload(s, BuiltinTokenizer(), dataset_dirs=[str(allowed)])
    first, second = w.measured
    assert first.images == 2 and second.images == 1 and w.stats == {"images": 3}
    assert first.messages is not None and second.messages is not None
    text, a, b = first.messages[0]["content"]
    assert text == {"type": "text", "text": "what is in these"} and first.input_tokens == 4
    assert _png_of(a["image_url"]["url"]) == (allowed / "a.png").read_bytes()
    assert b["image_url"]["url"] == "data:image/jpeg;base64," + base64.b64encode(JPEG).decode()
    assert second.messages[0] == {"role": "system", "content": "be brief"}
    assert second.messages[1]["content"][0] == {"type": "text", "text": "and this one"}
    assert second.messages[1]["content"][1]["type"] == "image_url"


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("../outside/c.png", "not an image file this worker may read"),
        ("link.png", "not an image file this worker may read"),
        ("missing.png", "not an image file this worker may read"),
        ("/etc/passwd", "not an image file this worker may read"),
        ("/dev/zero", "not an image file this worker may read"),
        ("sub", "not an image file this worker may read"),
        ("notes.png", "not an image (PNG, JPEG, GIF or WebP"),
        (7, "must be a non-empty file name"),
    ],
)
def test_an_image_a_worker_may_not_read_is_refused_naming_the_field(
    dirs: tuple[Path, Path], name: object, says: str
) -> None:
    allowed, _ = dirs
    path = _dataset(allowed, [{"prompt": "fine", "images": ["a.png"]},
                              {"prompt": "x", "images": ["a.png", name]}])  # fmt: skip
    with Listener() as target:
        s = spec(dataset="jsonl", dataset_path=path, base_url=target.url, num_prompts=2)
        with pytest.raises(DatasetError) as e:
            run(run_load(s, run_tag="t", dataset_dirs=[str(allowed)]))
        assert target.requests() == []  # nothing sent
    text = str(e.value)
    assert text.startswith("dataset_path line 2: 'images'[1]: ") and says in text, text
    assert "root:" not in text and "outside" not in text


def test_images_are_bounded_and_listed(dirs: tuple[Path, Path], monkeypatch: Any) -> None:
    allowed, outside = dirs
    monkeypatch.setattr(img, "MAX_IMAGE_BYTES", 40)
    path = _dataset(allowed, [{"prompt": "x", "images": ["a.png"]}])
    with pytest.raises(DatasetError, match=r"'images'\[0\]: the image is over 40 bytes"):
        build_workload(spec(dataset="jsonl", dataset_path=path), BuiltinTokenizer())
    monkeypatch.undo()
    for bad, says in (([], "must be a list of 1 to 32"), ("a.png", "must be a list")):
        path = _dataset(allowed, [{"prompt": "x", "images": bad}])
        with pytest.raises(DatasetError, match=says):
            build_workload(spec(dataset="jsonl", dataset_path=path), BuiltinTokenizer())
    # the local CLI (no directories) reads its own files, beside the dataset file
    path = _dataset(outside, [{"prompt": "x", "images": ["c.png"]}])
    w = build_workload(spec(dataset="jsonl", dataset_path=path), BuiltinTokenizer())
    assert w.measured[0].images == 1
    # a surface without messages refuses a line with images
    with pytest.raises(DatasetError, match=r"dataset_path: .*'completions'"):
        build_workload(spec(dataset="jsonl", dataset_path=path, endpoint="completions"),
                       BuiltinTokenizer())  # fmt: skip


# ----------------------------------------------------------------------- measured


def test_prompt_tokens_are_the_servers_else_the_run_says_images_are_not_counted() -> None:
    sim = start_simulator_thread(SimConfig(ttft_ms=2, itl_ms=0.2, image_tokens=100, seed=3))
    try:
        s = spec(base_url=sim.base_url, dataset_options={"image_count": 2, "image_size": "32x32"})
        res = run(run_load(s, run_tag="mm"))
        truth = sim.ground_truth()["requests"]
        sim.reset()
        cut = run(run_load(s.model_copy(update={"token_counting": "tokenizer"}), run_tag="c"))
    finally:
        sim.stop()
    for r in res.records:
        assert r.status is RequestStatus.OK
        g = truth[f"mm-{r.index}"]
        assert r.input_tokens == g["input_tokens"] == 6 + 2 * 100  # text + the images
        assert r.tokenizer_input_tokens == 6
    notes = run_meta(res).validity
    assert not any("not counted" in n for n in notes), notes
    assert all(r.input_tokens == 6 for r in cut.records)
    notes = run_meta(cut).validity
    note = next(n for n in notes if "image parts are not counted" in n)
    assert "on 3 of 3 requests" in note and "carry 6 images" in note
