"""Workloads: exact-length random prompts (built-in and Hugging Face tokenizers), JSONL."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from app.client.datasets.base import REFUSED, WorkloadCancelled
from app.client.datasets.jsonl import load_jsonl
from app.client.datasets.random import random_prompt_text
from app.client.spec import RunSpec
from app.client.tokenizer import WORDS, BuiltinTokenizer, HFTokenizer
from app.client.workload import build_workload


@pytest.mark.parametrize("n", [1, 2, 7, 256, 3000])
def test_builtin_random_prompt_is_exact(n: int) -> None:
    tok = BuiltinTokenizer()
    text = random_prompt_text(tok, n, np.random.default_rng(n))
    assert tok.count(text) == n


def test_random_workload_seeded_and_warmups_separate() -> None:
    tok = BuiltinTokenizer()
    spec = RunSpec(base_url="http://x", model="m", input_len=32, num_prompts=5, seed=9)
    a = build_workload(spec, tok)
    b = build_workload(spec.model_copy(update={"warmup_requests": 3}), tok)
    c = build_workload(spec.model_copy(update={"seed": 10}), tok)
    assert [p.prompt for p in a.measured] == [p.prompt for p in b.measured]
    assert len(b.warmup) == 3 and b.warmup[0].prompt not in {p.prompt for p in b.measured}
    assert [p.prompt for p in a.measured] != [p.prompt for p in c.measured]
    assert all(p.input_tokens == 32 and p.output_len == spec.output_len for p in a.measured)
    assert len({p.prompt for p in a.measured}) == 5


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> HFTokenizer:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    rng = np.random.default_rng(0)
    corpus = [" ".join(rng.choice(WORDS, 40)) + "." for _ in range(300)]
    tok.train_from_iterator(corpus, trainer)
    d = tmp_path_factory.mktemp("tok")
    tok.save(str(d / "tokenizer.json"))
    return HFTokenizer(str(d))


@pytest.mark.parametrize("n", [1, 5, 64, 500])
def test_hf_random_prompt_is_exact(hf_tokenizer: HFTokenizer, n: int) -> None:
    for seed in range(5):
        text = random_prompt_text(hf_tokenizer, n, np.random.default_rng(seed))
        assert hf_tokenizer.count(text) == n


def test_hf_random_prompt_seeded(hf_tokenizer: HFTokenizer) -> None:
    a = random_prompt_text(hf_tokenizer, 50, np.random.default_rng(1))
    b = random_prompt_text(hf_tokenizer, 50, np.random.default_rng(1))
    assert a == b


def test_jsonl_prompts_and_messages(tmp_path: Path) -> None:
    p = tmp_path / "p.jsonl"
    p.write_text(
        '{"prompt": "hello world"}\n'
        "\n"
        '{"messages": [{"role": "user", "content": "one two three"}], "output_len": 7}\n'
    )
    tok = BuiltinTokenizer()
    items = load_jsonl(str(p), tok, 100)
    assert items[0].prompt == "hello world" and items[0].input_tokens == 2
    assert items[0].output_len == 100 and items[0].messages is None
    assert items[1].prompt is None and items[1].messages is not None
    assert items[1].input_tokens == 3 and items[1].output_len == 7
    spec = RunSpec(
        base_url="http://x",
        model="m",
        dataset="jsonl",
        dataset_path=str(p),
        num_prompts=5,
        warmup_requests=1,
    )
    w = build_workload(spec, tok)
    assert len(w.measured) == 5 and w.measured[2].prompt == "hello world"  # cycled
    assert w.warmup == [items[1]]  # warm-ups from the end of the file


@pytest.mark.parametrize(
    ("line", "msg"),
    [
        ("not json", "not valid JSON"),
        ("[1]", "expected a JSON object"),
        ('{"text": "x"}', "'prompt', 'messages' or 'query'"),
        ('{"prompt": ""}', "'prompt' must be"),
        ('{"prompt": "x", "output_len": 0}', "output_len"),
        ('{"messages": []}', "'messages' must be"),
        ('{"messages": [{"content": "x"}]}', "'role'"),
    ],
)
def test_jsonl_bad_line_named(tmp_path: Path, line: str, msg: str) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(ValueError) as e:
        load_jsonl(str(p), BuiltinTokenizer(), 10)
    assert "dataset_path line 2" in str(e.value) and msg in str(e.value)


def test_jsonl_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "empty.jsonl"
    p.write_text("\n\n")
    with pytest.raises(ValueError, match="no prompts"):
        load_jsonl(str(p), BuiltinTokenizer(), 10)


# --------------------------------------------------------------------------- hostile paths


def _good(tmp_path: Path) -> Path:
    d = tmp_path / "datasets"
    d.mkdir()
    f = d / "ok.jsonl"
    f.write_text('{"prompt": "hello there"}\n')
    return f


def test_worker_reads_only_inside_its_dataset_dirs(tmp_path: Path) -> None:
    f = _good(tmp_path)
    tok = BuiltinTokenizer()
    assert len(load_jsonl(str(f), tok, 4, dirs=[str(f.parent)])) == 1
    outside = tmp_path / "secret.jsonl"
    outside.write_text('{"prompt": "the secret"}\n')
    link = f.parent / "link.jsonl"
    link.symlink_to(outside)  # a symlink out of the directory does not count as inside
    for path in (outside, link, f.parent / "../secret.jsonl", tmp_path / "missing.jsonl"):
        with pytest.raises(ValueError) as e:
            load_jsonl(str(path), tok, 4, dirs=[str(f.parent)])
        assert str(e.value) == REFUSED  # the same words whether it exists or not
        assert str(tmp_path) not in str(e.value)
    with pytest.raises(ValueError, match="not a dataset file"):
        load_jsonl(str(f), tok, 4, dirs=[])  # no directories configured: no files at all


def test_devices_fifos_and_directories_are_refused_without_hanging(tmp_path: Path) -> None:
    d = tmp_path / "datasets"
    d.mkdir()
    fifo = d / "pipe.jsonl"
    os.mkfifo(fifo)  # opening it for reading would block forever without O_NONBLOCK
    (d / "zero.jsonl").symlink_to("/dev/zero")
    tok = BuiltinTokenizer()
    for path in (fifo, d / "zero.jsonl", d):
        with pytest.raises(ValueError) as e:
            load_jsonl(str(path), tok, 4, dirs=[str(d)])
        assert str(e.value) == REFUSED
    with pytest.raises(ValueError, match="not a regular file"):
        load_jsonl("/dev/zero", tok, 4)  # the local CLI too: never read a device


def test_oversized_dataset_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import app.client.datasets.base as ds

    f = _good(tmp_path)
    f.write_text('{"prompt": "x"}\n' * 100)
    monkeypatch.setattr(ds, "MAX_DATASET_BYTES", 1000)
    with pytest.raises(ValueError, match="larger than"):
        load_jsonl(str(f), BuiltinTokenizer(), 4, dirs=[str(f.parent)])


def test_workload_building_is_cancellable() -> None:
    spec = RunSpec(base_url="http://h:1", model="m", num_prompts=5000, input_len=64)
    polls: list[int] = []

    def cancelled() -> bool:
        polls.append(1)
        return len(polls) >= 3  # cancelled during the third poll

    with pytest.raises(WorkloadCancelled):
        build_workload(spec, BuiltinTokenizer(), cancelled=cancelled)
    assert len(polls) == 3  # stopped there: it did not build the remaining prompts


def test_prompt_budget_bounds_the_workload() -> None:
    from pydantic import ValidationError

    from app.client.spec import MAX_PROMPT_TOKENS

    ok = RunSpec(base_url="http://h:1", model="m", num_prompts=200_000, input_len=1000)
    assert ok.num_prompts * ok.input_len == MAX_PROMPT_TOKENS
    with pytest.raises(ValidationError) as e:  # 1e7 x 1e6 tokens: refused before any work
        RunSpec(base_url="http://h:1", model="m", num_prompts=10_000_000, input_len=1_000_000)
    assert "num_prompts" in str(e.value) and "budget" in str(e.value)
    with pytest.raises(ValidationError, match="warmup_requests"):
        RunSpec(base_url="http://h:1", model="m", warmup_requests=10**9)
    with pytest.raises(ValidationError, match="budget"):  # warm-ups count in the budget
        RunSpec(
            base_url="http://h:1",
            model="m",
            num_prompts=100_000,
            warmup_requests=100_000,
            input_len=1001,
        )


# ------------------------------------------------------------------ the dataset registry


def test_the_spec_names_a_registered_dataset_type() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as e:
        RunSpec(base_url="http://h:1", model="m", dataset="sharegpt-typo")
    known = "random, jsonl, sharegpt, prefix_repetition, mooncake, timed_jsonl, random-mm, "
    known += "agentic, otel, weka"
    assert f"dataset: unknown dataset type 'sharegpt-typo' (one of: {known})" in str(e.value)
    with pytest.raises(ValidationError, match="dataset_path is required"):
        RunSpec(base_url="http://h:1", model="m", dataset="jsonl")


def test_dataset_options_belong_to_the_type() -> None:
    """A type refuses options that are not its own, naming the field."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as e:
        RunSpec(
            base_url="http://h:1",
            model="m",
            dataset="jsonl",
            dataset_path="/d.jsonl",
            dataset_options={"range_ratio": 0.5},
        )
    assert "dataset_options.range_ratio: Extra inputs are not permitted" in str(e.value)


def test_a_new_dataset_type_is_one_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registering a type (as its module would) is all a spec, its checks and the workload
    builder need: a type with an option of its own, checked and used."""
    from pydantic import BaseModel, ValidationError

    from app.client import datasets
    from app.client.datasets.base import BuildContext, Prompt, Workload, WorkloadParams

    class RepeatOptions(BaseModel):
        model_config = {"extra": "forbid"}
        word: str = "hi"

    class Repeat:
        name = "repeat"
        summary = "one word repeated input_len times"
        options: type[BaseModel] = RepeatOptions
        timed = False

        def check(self, params: WorkloadParams, options: BaseModel) -> None:
            assert isinstance(options, RepeatOptions)
            if " " in options.word:
                raise ValueError("dataset_options.word: one word, no spaces")

        def prompt_tokens(self, params: WorkloadParams, options: BaseModel) -> int | None:
            return (params.num_prompts + params.warmup_requests) * params.input_len

        def build(self, params: WorkloadParams, options: BaseModel, ctx: BuildContext) -> Workload:
            assert isinstance(options, RepeatOptions)
            text = " ".join([options.word] * params.input_len)
            one = Prompt(text, None, ctx.tokenizer.count(text), params.output_len)
            return Workload([], [one] * params.num_prompts)

    monkeypatch.setitem(datasets.DATASETS, "repeat", Repeat())
    spec = RunSpec(
        base_url="http://h:1",
        model="m",
        dataset="repeat",
        dataset_options={"word": "yes"},
        num_prompts=3,
        input_len=4,
    )
    w = build_workload(spec, BuiltinTokenizer())
    assert [p.prompt for p in w.measured] == ["yes yes yes yes"] * 3
    assert [p.input_tokens for p in w.measured] == [4, 4, 4]
    with pytest.raises(ValidationError, match=r"dataset_options\.word: one word"):
        RunSpec(base_url="http://h:1", model="m", dataset="repeat", dataset_options={"word": "a b"})
