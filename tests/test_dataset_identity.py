"""Every dataset_path-based dataset type records the file's sha256 (``Workload.source``), so
two runs on different files never compare as the same workload."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from app.analysis.comparability import check, comparability_key
from app.client.datasets.base import BuildContext
from app.client.datasets.conversations import build_sessions
from app.client.spec import RunSpec
from app.client.tokenizer import BuiltinTokenizer
from app.client.workload import build_workload

FILES: dict[str, tuple[str, str]] = {  # dataset -> (one file, another file)
    "jsonl": ('{"prompt": "hello world"}\n', '{"prompt": "hello there"}\r\n'),
    "timed_jsonl": (
        '{"timestamp": 0, "prompt": "a b c"}\n{"timestamp": 5, "prompt": "d e"}\n',
        '{"timestamp": 0, "prompt": "a b c"}\n{"timestamp": 6, "prompt": "d e"}\n',
    ),
    "mooncake": (
        '{"timestamp": 0, "input_length": 3, "output_length": 2, "hash_ids": [1]}\n',
        '{"timestamp": 0, "input_length": 3, "output_length": 2, "hash_ids": [2]}\n',
    ),
}


def _spec(dataset: str, path: Path, **over: Any) -> RunSpec:
    base: dict[str, Any] = {
        "base_url": "http://h:1",
        "model": "m",
        "dataset": dataset,
        "dataset_path": str(path),
        "num_prompts": 1,
        "warmup_requests": 0,
    }
    return RunSpec.model_validate(base | over)


def _sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("dataset", sorted(FILES))
def test_file_datasets_record_the_files_sha256(tmp_path: Path, dataset: str) -> None:
    one, other = FILES[dataset]
    p = tmp_path / "data.jsonl"
    tok = BuiltinTokenizer()
    p.write_text(one, newline="")
    spec = _spec(dataset, p)
    a = build_workload(spec, tok).source
    again = build_workload(spec, tok).source
    p.write_text(other, newline="")  # the same path, another file
    b = build_workload(spec, tok).source
    assert a == again == _sha(one)  # what sha256sum prints for the file
    assert b == _sha(other) and a != b
    dumped = spec.model_dump(mode="json")
    key_a = comparability_key(dumped, dataset_source=a)
    same = check([key_a, comparability_key(dumped, dataset_source=again)])
    assert same.comparable and not same.differing
    differ = check([key_a, comparability_key(dumped, dataset_source=b)])
    assert [d.field for d in differ.differing] == ["dataset_source"]
    assert differ.variable == "dataset_source"  # flagged: the file is what differs
    assert "dataset file" in differ.message()
    engine = check([key_a, comparability_key(dumped, dataset_source=b)], variable="engine")
    assert not engine.comparable  # comparing engines on other files: refused as one-variable
    assert "dataset file" in engine.message()


def test_multi_turn_jsonl_records_the_files_sha256(tmp_path: Path) -> None:
    text = '{"turns": ["hi there", "and then"]}\n'
    p = tmp_path / "conv.jsonl"
    p.write_text(text)
    spec = _spec("jsonl", p, multi_turn=True, endpoint="chat")
    got = build_sessions(
        "jsonl", spec.workload_params(), None, BuildContext(BuiltinTokenizer()), None
    )
    assert got.source == _sha(text)


def test_a_non_utf8_line_is_named(tmp_path: Path) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_bytes(b'{"prompt": "fine"}\n{"prompt": "\xff"}\n')
    with pytest.raises(ValueError, match="dataset_path line 2: the file is not UTF-8 text"):
        build_workload(_spec("jsonl", p), BuiltinTokenizer())


def test_stored_runs_on_other_files_at_one_path_are_flagged_by_compare(tmp_path: Path) -> None:
    from app.services import compare as compare_svc
    from app.services.runs import open_database
    from app.targets.sim_config import SimConfig
    from tests.live_server import free_port
    from tests.web_support import bench

    p = tmp_path / "prompts.jsonl"
    sessions = open_database(f"sqlite:///{tmp_path / 'c.db'}")
    sim = SimConfig(ttft_ms=2, itl_ms=0.5, seed=1, port=free_port())  # one target
    kw: dict[str, Any] = {"dataset": "jsonl", "dataset_path": str(p), "num_prompts": 4}
    p.write_text('{"prompt": "one two three"}\n')
    a = bench(sessions, sim, "a", **kw)
    b = bench(sessions, sim, "b", **kw)  # the same file
    p.write_text('{"prompt": "four five six"}\n')  # another file, the same path and lengths
    c = bench(sessions, sim, "c", **kw)
    ra, rb, rc = (compare_svc.load_samples(sessions, i) for i in (a, b, c))
    assert ra.key["dataset_source"] == _sha('{"prompt": "one two three"}\n')
    assert rb.key["dataset_source"] == ra.key["dataset_source"]
    assert rc.key["dataset_source"] == _sha('{"prompt": "four five six"}\n')
    assert not check([ra.key, rb.key]).differing
    other = check([ra.key, rc.key], variable="seed")
    assert [d.field for d in other.differing] == ["dataset_source"] and not other.comparable
    assert "dataset file" in other.message()
