"""The built-in "reasoning_gym" task: reasoning-gym's procedural problems, offline, with their own grader.

`build(num_train, num_eval, seed, dataset="basic_arithmetic", **dataset_kwargs)` makes rows
from `reasoning_gym.create_dataset(dataset, seed=..., size=..., **dataset_kwargs)`; train
and held-out rows come from different seeds, and held-out questions that also occur in
the training rows are skipped, so the two never overlap. Each row keeps the dataset name,
config, seed and index, so the verifier re-creates the exact entry that reasoning-gym's
`score_answer` expects (entries are generated deterministically from seed and index).

The prompt asks for the final answer inside `<answer></answer>`; `is_correct` takes the one
answer block (none, or several, is wrong) and counts `score_answer(...) >= 1.0` as correct.
The task's reward is that 1.0 / 0.0; `score_reward` gives reasoning-gym's partial credit
instead (reward spec `tinyrl.tasks.reasoning_gym_task:score_reward`).

Task arg `extract` says how the answer is read (the two modes of lm-evaluation-harness):
`"tags"` (default, reasoning-gym's own rule: the one `<answer>` block) or `"flexible"`: the
one `<answer>` block if there is one, else the final answer as `tinyrl.rewards.math` reads it
leniently (`\boxed{}`, "the answer is ...", else the last number), after cutting any text
copied from the question. Small instruct models answer "8 + 2 = 10" and seldom write the tags;
"flexible" grades what they compute, "tags" also grades the format.

Needs `pip install 'tinyrl-rlvr[gym]'`.
"""

from __future__ import annotations

import functools
import json

from tinyrl.errors import MissingExtra
from tinyrl.rewards.guards import answer_blocks
from tinyrl.rewards.math import extract_answer as final_answer
from tinyrl.tasks.base import Task

PROMPT = "{question}\n\nGive your final answer inside <answer></answer> tags."
EVAL_SEED_OFFSET = 1_000_003  # held-out rows come from seed + this
EXTRACT_MODES = ("tags", "flexible")


def _rg():
    try:
        import reasoning_gym  # noqa: PLC0415 (lazy: an optional extra, slow to import)
    except ImportError as e:
        raise MissingExtra("the reasoning_gym task needs reasoning-gym: pip install 'tinyrl-rlvr[gym]'") from e
    return reasoning_gym


@functools.lru_cache(maxsize=64)
def _dataset(name: str, config: str, seed: int, size: int):
    return _rg().create_dataset(name, seed=seed, size=size, **json.loads(config))


@functools.lru_cache(maxsize=4096)
def _entry(name: str, config: str, seed: int, size: int, index: int) -> dict:
    return _dataset(name, config, seed, size)[index]


def _rows(name: str, config: str, seed: int, size: int, count: int, skip: set[str], extract: str) -> list[dict]:
    ds = _dataset(name, config, seed, size)
    rows = []
    for index in range(size):
        if len(rows) == count:
            break
        entry = ds[index]
        if entry["question"] in skip:
            continue
        skip.add(entry["question"])  # no duplicates within a split either
        rows.append({"prompt": PROMPT.format(question=entry["question"]), "answer": str(entry["answer"]),
                     "question": entry["question"], "rg_dataset": name, "rg_config": config,
                     "rg_seed": seed, "rg_size": size, "rg_index": index, "rg_extract": extract})
    if len(rows) < count:
        raise ValueError(f"reasoning_gym: {name!r} gave only {len(rows)} distinct problems of {count} asked; "
                         f"ask for fewer rows or widen the dataset's settings")
    return rows


def build(num_train: int, num_eval: int, seed: int = 0, dataset: str = "basic_arithmetic", extract: str = "tags",
          **dataset_kwargs) -> tuple[list[dict], list[dict]]:
    """(train_rows, eval_rows) of reasoning-gym `dataset`; disjoint questions, deterministic for a seed."""
    if extract not in EXTRACT_MODES:
        raise ValueError(f"reasoning_gym: extract must be one of {list(EXTRACT_MODES)}, got {extract!r}")
    rg = _rg()
    if dataset not in rg.factory.DATASETS:
        raise ValueError(f"reasoning_gym: unknown dataset {dataset!r}; e.g. {sorted(rg.factory.DATASETS)[:12]} ...")
    config = json.dumps(dataset_kwargs, sort_keys=True)
    seen: set[str] = set()
    train = _rows(dataset, config, seed, 2 * num_train + 16, num_train, seen, extract)
    held = _rows(dataset, config, seed + EVAL_SEED_OFFSET, 4 * num_eval + 16, num_eval, seen, extract)
    return train, held


def extract_answer(completion: str) -> str | None:
    """The text of the one non-empty `<answer>` block (None when there is none or more than one).

    Empty blocks are skipped: echoing the prompt's instruction adds nothing.

    >>> extract_answer("so <answer> -4 </answer>"), extract_answer("<answer>1</answer><answer>2</answer>")
    ('-4', None)
    """
    found = [a for a in answer_blocks(completion) if a.strip()]
    return found[0].strip() if len(found) == 1 else None


def read_answer(completion: str, row: dict) -> str | None:
    """The completion's answer under the row's `extract` mode (see the module docstring)."""
    answer = extract_answer(completion)
    if answer is None and row.get("rg_extract", "tags") == "flexible":
        answer = final_answer(completion, mode="lenient", prompt=row.get("question"))
    return answer


def score(completion: str, row: dict) -> float:
    """reasoning-gym's own score (0..1) of the completion's answer for this row."""
    answer = read_answer(completion, row)
    if answer is None:
        return 0.0
    entry = _entry(row["rg_dataset"], row["rg_config"], int(row["rg_seed"]), int(row["rg_size"]), int(row["rg_index"]))
    ds = _dataset(row["rg_dataset"], row["rg_config"], int(row["rg_seed"]), int(row["rg_size"]))
    return float(ds.score_answer(answer, entry))


def is_correct(completion: str, row: dict) -> bool:
    """Correct when reasoning-gym scores the completion's answer at 1.0 (full credit)."""
    return score(completion, row) >= 1.0


def score_reward(prompts: list, completions: list, **columns) -> list[float]:
    """reasoning-gym's partial credit (TRL reward signature) instead of the task's 1.0 / 0.0."""
    rows = [{k: v[i] for k, v in columns.items()} for i in range(len(completions))]
    return [score(c if isinstance(c, str) else c[0]["content"], r) for c, r in zip(completions, rows)]


TASK = Task(
    name="reasoning_gym",
    description="a reasoning-gym dataset (`dataset`, default basic_arithmetic, plus its settings), "
                "answer in <answer></answer> (extract: flexible also reads an untagged final answer), "
                "graded by the dataset's own score_answer",
    build=build,
    is_correct=is_correct,
)
