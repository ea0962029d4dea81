"""Workloads: exact-length random prompts (built-in and Hugging Face tokenizers), JSONL."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.domain import RunSpec
from app.loadgen.datasets import build_workload, load_jsonl, random_prompt_text
from app.loadgen.tokenizer import WORDS, BuiltinTokenizer, HFTokenizer


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
        ('{"text": "x"}', "'prompt' or 'messages'"),
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
    assert f"{p}:2" in str(e.value) and msg in str(e.value)


def test_jsonl_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "empty.jsonl"
    p.write_text("\n\n")
    with pytest.raises(ValueError, match="no prompts"):
        load_jsonl(str(p), BuiltinTokenizer(), 10)
