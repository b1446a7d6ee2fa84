"""Data that `datasets` already slices and mixes: `data.split` slices, `data.mix` through `interleave_datasets`, and
`data.filter` before training (tinyrl/config/schema_data.py, tinyrl/datasets_source.py, tinyrl/tasks/mix.py,
tinyrl/data.py). Every dataset is a local file the test writes; nothing downloads."""

from __future__ import annotations

import json
import logging
import math
import random
from collections import Counter

import pytest

datasets = pytest.importorskip("datasets")

import tinyrl  # noqa: E402
from tinyrl.config import load_config  # noqa: E402
from tinyrl.data import load_rows  # noqa: E402
from tinyrl.errors import ConfigError  # noqa: E402

_rng = random.Random(0)
SUMS = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a, b in
        ((_rng.randint(10, 99), _rng.randint(10, 99)) for _ in range(60))]  # prompts of 6 tokens
SMALL = [{"x": a, "y": b, "solution": f"so \\boxed{{{a + b}}}"} for a, b in
         ((_rng.randint(1, 9), _rng.randint(1, 9)) for _ in range(30))]  # "{x}+{y}=": 4 tokens
TINY = {"model.name": "tiny-arith", "train.steps": 2, "train.prompts_per_step": 2, "rollout.num_generations": 2,
        "train.micro_batch_size": 4, "train.eval_before_after": False, "log.progress": False,
        "rollout.max_new_tokens": 4, "reward.functions": [{"name": "task"}, {"name": "math_lenient"}]}


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def files(tmp_path):
    folder = tmp_path / "sums"  # a folder with a train and a test split (datasets names them by file)
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", SUMS[:50])
    write_jsonl(folder / "test.jsonl", SUMS[50:])
    return {"sums": write_jsonl(tmp_path / "sums.jsonl", SUMS), "small": write_jsonl(tmp_path / "small.jsonl", SMALL),
            "folder": str(folder)}


def data_cfg(**over):
    return load_config(None, {"data.num_train": 1000, "data.num_eval": 0, "train.eval_before_after": False,
                              **over})[1].data


def prompts(rows):
    return sorted(r["prompt"] for r in rows)


# ------------------------------------------------------------------ slices


@pytest.mark.parametrize("split, want", [
    ("train", SUMS), ("train[:10%]", SUMS[:6]), ("train[10:20]", SUMS[10:20]), ("train[-5:]", SUMS[-5:]),
    ("train[:50%]", SUMS[:30]), ("train[:33%](closest)", SUMS[:20]),  # 19.8 rows, rounded
])
def test_split_slices_pick_the_rows_datasets_picks(files, split, want):
    train, held, _ = load_rows(data_cfg(**{"data.dataset": files["sums"], "data.split": split,
                                           "data.columns": {"prompt": "question"}}))
    assert prompts(train) == sorted(r["question"] for r in want) and held == []


def test_slices_join_splits_with_plus_and_slice_the_held_out_split(files):
    cfg = data_cfg(**{"data.dataset": files["folder"], "data.split": "train[:50%]+test[:4]",
                      "data.eval_split": "test[-3:]", "data.num_eval": 100, "data.columns": {"prompt": "question"}})
    train, held, task = load_rows(cfg)
    assert prompts(train) == sorted(r["question"] for r in SUMS[:25] + SUMS[50:54])
    assert prompts(held) == sorted(r["question"] for r in SUMS[57:]) and task.name == "dataset"


@pytest.mark.parametrize("split, words", [
    ("train[100:]", r"data.split: 'train\[100:\]' selects no rows of split 'train' \(60 rows"),
    ("train[50:-20]", r"data.split: 'train\[50:-20\]' selects no rows of split 'train'"),
    ("train[:33%](pct1_dropremainder)", r"data.split: .*less than 100 elements is forbidden"),  # datasets' words
    ("test[:5]", r"data.split: .* has no split named in 'test\[:5\]'; its splits: \['train'\]"),
])
def test_a_slice_that_selects_nothing_here_names_the_field(files, split, words):
    with pytest.raises(ConfigError, match=words):
        load_rows(data_cfg(**{"data.dataset": files["sums"], "data.split": split,
                              "data.columns": {"prompt": "question"}}))


# ------------------------------------------------------------------ mixtures


def mix(files, **over):
    return {"data.mix": [
        {"dataset": files["sums"], "weight": 3, "columns": {"prompt": "question"}, "answer_extractor": "plain"},
        {"dataset": files["small"], "weight": 1, "prompt_template": "{x}+{y}=", "columns": {"answer": "solution"},
         "answer_extractor": "boxed", "split": "train[:24]"}], **over}


def test_mix_interleaves_by_weight_each_source_read_its_own_way(files):
    cfg = data_cfg(**mix(files, **{"data.num_train": 40, "data.num_eval": 8, "data.eval_fraction": 0.1}))
    train, held, task = load_rows(cfg)
    assert cfg.task == "dataset" and task.name == "dataset" and len(train) == 40
    small = {f"{r['x']}+{r['y']}=": str(r["x"] + r["y"]) for r in SMALL[:24]}
    sums = {r["question"]: r["answer"] for r in SUMS}
    for r in train + held:  # each source's own template and extractor: the prompt and the gold
        assert r["gold"] == (small.get(r["prompt"]) or sums[r["prompt"]])
    n_small = sum(r["prompt"] in small for r in train)
    assert 4 <= n_small <= 16  # about a quarter (weight 1 of 4) of 40
    assert {r["prompt"] in small for r in held} == {True, False}  # the held-out rows cover both sources
    again, _, _ = load_rows(cfg)
    other, _, _ = load_rows(data_cfg(**mix(files, **{"data.num_train": 40, "data.num_eval": 8, "data.seed": 1,
                                                     "data.eval_fraction": 0.1})))
    assert [r["prompt"] for r in again] == [r["prompt"] for r in train]  # seeded
    assert [r["prompt"] for r in other] != [r["prompt"] for r in train]


def test_mix_stopping_strategies(files):
    first, _, _ = load_rows(data_cfg(**mix(files)))
    whole, _, _ = load_rows(data_cfg(**mix(files, **{"data.mix_stopping": "all_exhausted"})))
    counts = Counter(r["prompt"] for r in whole)
    assert len(whole) > len(first)
    assert len(counts) == len({r["question"] for r in SUMS}) + len({(r["x"], r["y"]) for r in SMALL[:24]})  # all seen
    assert len(first) < 60 + 24  # first_exhausted ends when the small source runs out


def test_mix_with_no_answers_anywhere_trains_on_your_rewards(files):
    cfg = data_cfg(**{"data.mix": [{"dataset": files["sums"], "columns": {"prompt": "question", "answer": None}},
                                   {"dataset": files["small"], "prompt_template": "{x}+{y}=",
                                    "columns": {"answer": None}}]})
    train, _, task = load_rows(cfg)
    assert task is None and "gold" not in train[0]


@pytest.mark.parametrize("source, words", [
    ({"columns": {"prompt": "nope"}}, r"data.mix\[1\].columns.prompt: .* has no column 'nope'"),
    ({"prompt_template": "{z}"}, r"data.mix\[1\].prompt_template: names \['z'\], not columns"),
    ({"prompt_template": "{x}", "columns": {"answer": None}}, r"data.mix\[1\].columns.answer: .* has no answer column"),
    ({"prompt_template": "{x}", "split": "train[40:]"}, r"data.mix\[1\].split: 'train\[40:\]' selects no rows"),
    ({"prompt_template": "{x}", "eval_split": "test"}, r"data.mix\[1\].eval_split: .* has no split"),
    ({"prompt_template": "{x}", "answer_extractor": "gsm8k"}, r"data.mix\[1\].answer_extractor 'gsm8k': .* no answer"),
])
def test_a_bad_source_names_its_index_when_the_rows_load(files, source, words):
    first = {"dataset": files["sums"], "columns": {"prompt": "question"}}
    with pytest.raises(ConfigError, match=words):
        load_rows(data_cfg(**{"data.mix": [first, {"dataset": files["small"], **source}]}))


# ------------------------------------------------------------------ bad config, at resolve


@pytest.mark.parametrize("over, words", [
    ({"data.mix": [{"dataset": "a/b", "weight": 0}]}, r"data.mix\[0\].weight: must be > 0"),
    ({"data.mix": [{"dataset": "a/b"}, {"dataset": "c/d", "weight": -1}]}, r"data.mix\[1\].weight: must be > 0"),
    ({"data.mix": [{"dataset": "a/b", "weight": math.nan}]}, r"data.mix\[0\].weight: must be > 0 and finite"),
    ({"data.mix": [{"dataset": "a/b", "weight": 1e9}]}, r"data.mix\[0\].weight: must be in \[0, 1e\+06\]"),
    ({"data.mix": [{"dataset": "a/b", "weight": "heavy"}]}, r"data.mix\[0\].weight: expected float"),
    ({"data.mix": [{"dataset": "a/b", "weight": True}]}, r"data.mix\[0\].weight: expected float"),
    ({"data.mix": [{"dataset": "a/b", "wieght": 2}]}, r"data.mix\[0\].wieght: unknown field \(did you mean 'weight'"),
    ({"data.mix": [{"weight": 2}]}, r"data.mix\[0\].dataset: required field is missing"),
    ({"data.mix": [{"dataset": "  "}]}, r"data.mix\[0\].dataset: must name a dataset"),
    ({"data.mix": [{"dataset": "./no/such.jsonl"}]}, r"data.mix\[0\].dataset: file or folder .*not found"),
    ({"data.mix": [{"dataset": "a/b", "split": "train[:200%]"}]}, r"data.mix\[0\].split: .*percent bound"),
    ({"data.mix": [{"dataset": "a/b", "columns": {"prompt": 3}}]}, r"data.mix\[0\].columns.prompt: must be a column"),
    ({"data.mix": [{"dataset": "a/b", "columns": {"gold": "x"}}]}, r"data.mix\[0\].columns: .*unknown keys \['gold'\]"),
    ({"data.mix": [{"dataset": "a/b", "prompt_template": "{q.__class__}"}]}, r"data.mix\[0\].prompt_template: may name"),
    ({"data.mix": [{"dataset": "a/b", "answer_extractor": "magic"}]}, r"data.mix\[0\].answer_extractor: expected one"),
    ({"data.mix": "a/b"}, r"data.mix: expected a list"),
    ({"data.mix": [{"dataset": f"a/b{i}"} for i in range(65)]}, r"data.mix: at most 64 sources, got 65"),
    ({"data.mix": [{"dataset": "a/b"}], "data.dataset": "c/d"}, r"data.mix: and data.dataset are two ways"),
    ({"data.mix": [{"dataset": "a/b"}], "data.columns": {"prompt": "q"}}, r"data.columns: with data.mix each source"),
    ({"data.mix": [{"dataset": "a/b"}], "data.split": "test"}, r"data.split: with data.mix each source"),
    ({"data.mix": [{"dataset": "a/b"}], "data.task": "arithmetic", "data.task_args": {}}, None),  # the default task
    ({"data.mix": [{"dataset": "a/b"}], "data.task": "gsm8k"}, r"data.mix: gives the rows of data.task 'dataset'"),
    ({"data.mix_stopping": "never"}, r"data.mix_stopping: expected one of 'first_exhausted', 'all_exhausted'"),
    ({"data.split": ""}, r"data.split: must name a split"),
    ({"data.split": "train["}, r"data.split: 'train\[' is not a split or a slice"),
    ({"data.split": "train[1:2:3]"}, r"data.split: 'train\[1:2:3\]' is not a split or a slice"),
    ({"data.split": "train[10:10]"}, r"data.split: 'train\[10:10\]' selects no rows"),
    ({"data.split": "train[:0]"}, r"data.split: 'train\[:0\]' selects no rows \(it ends at 0\)"),
    ({"data.split": "train[50%:20%]"}, r"data.split: 'train\[50%:20%\]' selects no rows"),
    ({"data.split": "train[:10%](nearest)"}, r"data.split: 'train\[:10%\]\(nearest\)': rounding must be one of"),
    ({"data.split": "train; rm -rf /"}, r"data.split: 'train; rm -rf /' is not a split"),
    ({"data.split": "train\x00"}, r"data.split: a string of at most .* no NUL"),
    ({"data.split": "t" * 2000}, r"data.split: a split spec of at most 1000 characters"),
    ({"data.split": "train[:99999999999999]"}, r"data.split: .*a row bound of at most 10\^12"),
    ({"data.eval_split": "test[5:1]"}, r"data.eval_split: 'test\[5:1\]' selects no rows"),
    ({"data.split": 3}, r"data.split: expected str"),
    ({"data.filter": {"max_prompt_tokens": 0}}, r"data.filter.max_prompt_tokens: must be >= 1 or null"),
    ({"data.filter": {"max_prompt_tokens": -5}}, r"data.filter.max_prompt_tokens: must be >= 1 or null"),
    ({"data.filter": {"max_prompt_tokens": 10**9}}, r"data.filter.max_prompt_tokens: must be in \[1, 10000000\], got 1000000000"),
    ({"data.filter": {"max_prompt_tokens": "10"}}, r"data.filter.max_prompt_tokens: expected int or null"),
    ({"data.filter": {"max_prompt_tokens": 1.5}}, r"data.filter.max_prompt_tokens: expected int or null"),
    ({"data.filter": {"max_prompt_tokens": True}}, r"data.filter.max_prompt_tokens: expected int or null"),
    ({"data.filter": {"min_prompt_tokens": 3}}, r"data.filter.min_prompt_tokens: unknown field"),
    ({"data.filter": 5}, r"data.filter: expected a mapping"),
])
def test_bad_slices_mixes_and_filters_fail_at_resolve_naming_the_field(over, words):
    if words is None:
        assert load_config(None, over)[1].data.task == "dataset"
        return
    with pytest.raises(ConfigError, match=words):
        load_config(None, over)


# ------------------------------------------------------------------ filter, and the whole run


def test_filter_drops_long_prompts_before_training_and_reports_the_count(files, tmp_path, caplog):
    over = {**TINY, **mix(files), "log.run_dir": str(tmp_path / "runs"), "data.num_train": 40, "data.num_eval": 6,
            "data.eval_fraction": 0.2, "data.filter": {"max_prompt_tokens": 5}}  # the sums' 6-token prompts go
    with caplog.at_level(logging.INFO, logger="tinyrl.data"):
        run = tinyrl.train(**over)
    summary = json.loads((run.path / "summary.json").read_text())
    dropped = summary["details"]["data_filter"]
    assert summary["steps"] == 2 and len(run.metrics) == 2
    assert dropped["max_prompt_tokens"] == 5 and dropped["train_kept"] + dropped["train_dropped"] == 40
    assert dropped["train_dropped"] >= 20 and dropped["held_out_dropped"] >= 1  # every sum, train and held out
    assert f"dropped {dropped['train_dropped']} of 40 training rows" in caplog.text
    samples = [json.loads(line) for line in (run.path / "samples.jsonl").read_text().splitlines()]
    assert samples and all(len(s["prompt"]) <= 5 for s in samples)  # char-level tokenizer: a token a character


def test_slices_and_a_mixture_train_end_to_end_on_local_files(files, tmp_path):
    over = {**TINY, "log.run_dir": str(tmp_path / "runs"), "data.num_train": 32, "data.num_eval": 4,
            "data.mix": [{"dataset": files["folder"], "split": "train[:80%]", "eval_split": "test[:4]", "weight": 2,
                          "columns": {"prompt": "question"}, "answer_extractor": "plain"},
                         {"dataset": files["small"], "split": "train[10:]", "prompt_template": "{x}+{y}=",
                          "columns": {"answer": "solution"}, "answer_extractor": "boxed"}],
            "data.mix_stopping": "all_exhausted"}
    run = tinyrl.train(**over)
    assert [m["step"] for m in run.metrics] == [1, 2]
    summary = json.loads((run.path / "summary.json").read_text())
    assert summary["error"] is None and "data_filter" not in summary["details"]  # no filter asked: none reported
    with pytest.raises(ConfigError, match=r"data.filter.max_prompt_tokens: 2 drops every training row \(the shortest"):
        tinyrl.train(**{**over, "data.filter": {"max_prompt_tokens": 2}, "log.name": "dropped-all"})
    assert not (tmp_path / "runs" / "dropped-all").exists()  # refused before the first step: no folder left
