"""The built-in "gsm8k" task: grade-school math word problems, openai/gsm8k from the hub or local files.

Data is not shipped. With no `path` the task loads `openai/gsm8k` (config `main`: its `train`
split to train on, `test` held out) through `datasets` (tinyrl.datasets_source: pip install
'tinyrl-rlvr[data]'); offline (`HF_HUB_OFFLINE=1`) from the local cache, which this fills:

    hf download openai/gsm8k --repo-type dataset
    tinyrl train qwen2.5-0.5b_grpo_math_gpu

or point the task at local files in the same format (jsonl or parquet, each row a `question`
and an `answer` whose last line is `#### <number>`):

    hf download openai/gsm8k --repo-type dataset --local-dir gsm8k
    tinyrl train qwen2.5-0.5b_grpo_math_gpu data.task_args.path=gsm8k/main

Task args: `dataset` (a hub id or anything `data.dataset` takes; default openai/gsm8k) and
`config` (default main), or `path` (a file, or a folder holding `train*.{jsonl,parquet}` and
optionally `test*.{jsonl,parquet}`) and `test_path` (held-out file; default: the folder's test
file, else a fixed 5% of the training file, chosen by a hash of the question so it never
changes); `prompt` (a format string with `{question}`).

Rows keep GSM8K's full `answer` (the reasoning and `#### n`); the verifier reads the number
after `####` as the gold answer and scores a completion with tinyrl's math verifier
(`\\boxed{}`, `<answer>`, `####` or "the answer is", compared by value).
"""

from __future__ import annotations

import json
import math
import random
import zlib
from pathlib import Path

from tinyrl.datasets_source import load_splits
from tinyrl.rewards.guards import normalize_answer
from tinyrl.rewards.math import extract_answer, gold_answer, math_scores
from tinyrl.tasks.base import Task

HUB_ID, HUB_CONFIG = "openai/gsm8k", "main"
PROMPT = "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
HELD_OUT_PERCENT = 5  # share of a lone training file held out when there is no test file
_SUFFIXES = (".jsonl", ".parquet")


def read_rows(path: str | Path) -> list[dict]:
    """Rows of one GSM8K-format file (.jsonl or .parquet); each must have `question` and `answer`."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"gsm8k: data file not found: {path} (data.task_args.path)")
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    elif path.suffix == ".parquet":
        rows = _read_parquet(path)
    else:
        raise ValueError(f"gsm8k: {path} is neither .jsonl nor .parquet")
    return check_rows(rows, str(path))


def check_rows(rows: list[dict], where: str) -> list[dict]:
    """`rows`, each checked to have a `question` and an `answer` ending in `#### <number>`."""
    for i, r in enumerate(rows):
        missing = [k for k in ("question", "answer") if k not in r]
        if missing:
            raise ValueError(f"gsm8k: row {i} of {where} lacks {missing} (openai/gsm8k rows have 'question' "
                             f"and 'answer' ending in '#### <number>'); it has {sorted(r)[:10]}")
        if "####" not in str(r["answer"]):
            raise ValueError(f"gsm8k: row {i} of {where}: its answer has no '#### <number>' line")
    return rows


def hub_rows(dataset: str, config: str | None) -> tuple[list[dict], list[dict] | None]:
    """(train rows, test rows or None) of a GSM8K-format dataset loaded through `datasets`."""
    splits = load_splits(dataset, config, None, field="data.task_args")
    if "train" not in splits:
        raise ValueError(f"gsm8k: {dataset!r} has no 'train' split; its splits: {sorted(splits)}")
    where = f"{dataset} ({config or 'default'})"
    test = check_rows(splits["test"].to_list(), f"{where}, split test") if "test" in splits else None
    return check_rows(splits["train"].to_list(), f"{where}, split train"), test


def _read_parquet(path: Path) -> list[dict]:
    try:
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    except ImportError:
        pass
    try:
        import pandas as pd

        return pd.read_parquet(path).to_dict("records")
    except ImportError as e:
        raise ValueError("gsm8k: reading .parquet needs pyarrow (pip install pyarrow), or give a .jsonl file") from e


def _find(folder: Path, stem: str) -> Path | None:
    for where in (folder, folder / "main"):
        for suffix in _SUFFIXES:
            hits = sorted(where.glob(f"{stem}*{suffix}"))
            if hits:
                return hits[0]
    return None


def _files(path: str, test_path: str | None) -> tuple[Path, Path | None]:
    p = Path(path).expanduser()
    if p.is_dir():
        train = _find(p, "train")
        if train is None:
            raise ValueError(f"gsm8k: no train*.jsonl or train*.parquet in {p} (or {p / 'main'})")
        return train, Path(test_path).expanduser() if test_path else _find(p, "test")
    return p, Path(test_path).expanduser() if test_path else None


def is_held_out(question: str) -> bool:
    return zlib.crc32(question.strip().encode()) % 100 < HELD_OUT_PERCENT


def make_row(raw: dict, prompt: str = PROMPT) -> dict:
    return {"prompt": prompt.format(question=raw["question"].strip()), "question": raw["question"],
            "answer": str(raw["answer"]), "gold": gold_answer(raw["answer"])}


def build(num_train: int, num_eval: int, seed: int = 0, path: str | None = None, test_path: str | None = None,
          prompt: str = PROMPT, dataset: str = HUB_ID, config: str | None = HUB_CONFIG,
          ) -> tuple[list[dict], list[dict]]:
    """(train_rows, eval_rows): seeded samples of the train and held-out splits or files (a lone train file
    or split: hash-split)."""
    if path:
        train_file, test_file = _files(path, test_path)
        train_raw, held_raw = read_rows(train_file), read_rows(test_file) if test_file is not None else None
    else:
        train_raw, held_raw = hub_rows(dataset, config)
    if held_raw is None:
        held_raw = [r for r in train_raw if is_held_out(r["question"])]
        train_raw = [r for r in train_raw if not is_held_out(r["question"])]
    rng = random.Random(f"gsm8k-{seed}")
    train = rng.sample(train_raw, min(num_train, len(train_raw)))
    held = random.Random(f"gsm8k-eval-{seed}").sample(held_raw, min(num_eval, len(held_raw)))
    return [make_row(r, prompt) for r in train], [make_row(r, prompt) for r in held]


def is_correct(completion: str, row: dict) -> bool:
    """The completion's one final answer equals the gold number (by value: 18 = 18.0 = 18.00).

    >>> row = {"answer": "She sells 16 - 3 - 4 = 9 eggs.\\n#### 18", "question": "How much?"}
    >>> is_correct("9 eggs at $2 each: \\\\boxed{18}", row), is_correct("\\\\boxed{18.0}", row)
    (True, True)
    >>> is_correct("The answer is 17.", row), is_correct("I think 18", row)  # strict: no marked answer
    (False, False)
    """
    score = math_scores([row.get("question")], [completion], [row["answer"]])["strict"][0]
    return bool(score)


def answer_of(completion: str, row: dict) -> str | None:
    """The final answer `is_correct` grades (the math verifier's strict extraction, the question's
    echo cut), normalised for voting (maj@k): a number by its value, other answers by their text.

    >>> [answer_of(c, {"question": "q"}) for c in ("\\\\boxed{18}", "#### 18.00", "\\\\boxed{1,200}", "no answer")]
    ['18', '18', '1200', None]
    >>> answer_of("so \\\\boxed{\\\\frac{1}{2}}", {"question": "q"})
    '\\\\frac{1}{2}'
    """
    found = extract_answer(completion, "strict", row.get("question"))
    if found is None:
        return None
    found = normalize_answer(found)
    try:
        value = float(found)
    except ValueError:
        return found
    if not math.isfinite(value):
        return found
    return str(int(value)) if value.is_integer() else repr(value)


TASK = Task(
    name="gsm8k",
    description="GSM8K math word problems: openai/gsm8k through `datasets` (data.task_args.dataset) or local "
                "jsonl/parquet (data.task_args.path); "
                "answer by value from \\boxed{}, ####, <answer> or 'the answer is'",
    build=build,
    is_correct=is_correct,
    answer_of=answer_of,
)
