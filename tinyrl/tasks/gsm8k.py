"""The built-in "gsm8k" task: grade-school math word problems from local files in openai/gsm8k's format.

Data is not shipped. Point the task at the dataset's files (jsonl or parquet, each row a
`question` and an `answer` whose last line is `#### <number>`):

    huggingface-cli download openai/gsm8k --repo-type dataset --local-dir gsm8k
    tinyrl train qwen2.5-0.5b_grpo_math_gpu data.task_args.path=gsm8k/main

Task args: `path` (a file, or a folder holding `train*.{jsonl,parquet}` and optionally
`test*.{jsonl,parquet}`), `test_path` (held-out file; default: the folder's test file, else
a fixed 5% of the training file, chosen by a hash of the question so it never changes),
`prompt` (a format string with `{question}`).

Rows keep GSM8K's full `answer` (the reasoning and `#### n`); the verifier reads the number
after `####` as the gold answer and scores a completion with tinyrl's math verifier
(`\\boxed{}`, `<answer>`, `####` or "the answer is", compared by value).
"""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path

from tinyrl.rewards.math import gold_answer, math_scores
from tinyrl.tasks.base import Task

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
    for i, r in enumerate(rows):
        missing = [k for k in ("question", "answer") if k not in r]
        if missing:
            raise ValueError(f"gsm8k: row {i} of {path} lacks {missing} (openai/gsm8k rows have 'question' "
                             f"and 'answer' ending in '#### <number>')")
        if "####" not in str(r["answer"]):
            raise ValueError(f"gsm8k: row {i} of {path}: its answer has no '#### <number>' line")
    return rows


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


def _files(path: str | None, test_path: str | None) -> tuple[Path, Path | None]:
    if not path:
        raise ValueError("gsm8k: no data file. Set data.task_args.path to a GSM8K train file or folder "
                         "(jsonl or parquet; e.g. `huggingface-cli download openai/gsm8k --repo-type dataset "
                         "--local-dir gsm8k`, then data.task_args.path=gsm8k/main)")
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
          prompt: str = PROMPT) -> tuple[list[dict], list[dict]]:
    """(train_rows, eval_rows): seeded samples of the train and held-out files (or hash-split train file)."""
    train_file, test_file = _files(path, test_path)
    train_raw = read_rows(train_file)
    if test_file is not None:
        held_raw = read_rows(test_file)
    else:
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


TASK = Task(
    name="gsm8k",
    description="GSM8K-format math word problems from local jsonl/parquet (data.task_args.path); "
                "answer by value from \\boxed{}, ####, <answer> or 'the answer is'",
    build=build,
    is_correct=is_correct,
)
