"""The "dataset" task: prompts and gold answers from any dataset (`data.dataset`), verified as math.

`data.dataset` names a hub id or a local file / folder (tinyrl.datasets_source loads it);
`data.config`, `data.split` and `data.eval_split` (else a seeded `data.eval_fraction` of the
split, held out) pick the rows; `data.columns` maps `prompt` and `answer` to the dataset's
columns; `data.prompt_template` (a format string over a row's columns) writes the prompt instead
of a prompt column. The gold answer is read from the answer column by a named extractor
(`data.answer_extractor`, ANSWER_EXTRACTORS) and a completion is scored by tinyrl's math verifier
(tinyrl.rewards.math: `\\boxed{}`, `<answer>`, `####` or "the answer is", compared by value).

Rows keep every column of the dataset (user reward functions receive them as keyword
arguments, TRL's convention), plus `prompt`, `gold` and, when the dataset has no `answer`
column, `answer` (the gold: what the `math_strict` / `math_lenient` rewards read).
A dataset with no answer column (or `data.columns.answer: null`) gives no verifier: rewards then
come from your functions.
"""

from __future__ import annotations

import logging
import random
from typing import Any

from tinyrl.datasets_source import load_splits, take_rows
from tinyrl.errors import ConfigError
from tinyrl.registry import Registry
from tinyrl.rewards.math import find_boxed, find_gsm8k, gold_answer, math_scores
from tinyrl.tasks.base import Task
from tinyrl.tasks.gsm8k import answer_of as gsm8k_answer_of
from tinyrl.templates import fields as template_fields
from tinyrl.templates import render

log = logging.getLogger("tinyrl.data")

ANSWER_COLUMNS = ("answer", "solution")  # looked for, in order, when data.columns names no answer column


def gsm8k_answer(answer: Any) -> str | None:
    """The number after GSM8K's `####`.

    >>> gsm8k_answer("3 + 4 = 7 apples.\\n#### 7")
    '7'
    """
    found = find_gsm8k(str(answer))
    return found[-1] if found else None


def boxed_answer(answer: Any) -> str | None:
    """The last `\\boxed{...}` of a solution (MATH's format).

    >>> boxed_answer("so x = \\\\boxed{\\\\frac{1}{2}}")
    '\\\\frac{1}{2}'
    """
    found = find_boxed(str(answer))
    return found[-1] if found else None


def plain_answer(answer: Any) -> str | None:
    """The answer column as it is (stripped).

    >>> plain_answer(" 42 ")
    '42'
    """
    text = str(answer).strip() if answer is not None else ""
    return text or None


# data.answer_extractor -> the function that reads the gold answer out of an answer column's value
ANSWER_EXTRACTORS = Registry("data.answer_extractor", {
    "auto": gold_answer,  # `#### n`, else the last \boxed{}, else the value itself
    "gsm8k": gsm8k_answer,
    "boxed": boxed_answer,
    "plain": plain_answer,
})


def prompt_text(value: Any, where: str) -> str:
    """A prompt column's value as the user turn: a string, or a one-user-turn message list."""
    if isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m for m in value):
        users = [m.get("content") for m in value if m["role"] == "user"]
        others = sorted({m["role"] for m in value} - {"user"})
        if len(users) != 1 or others:
            raise ConfigError(f"{where}: a prompt given as messages must be one user turn (set data.system_prompt "
                              f"for a system prompt); got roles {[m['role'] for m in value]}")
        value = users[0]
    if not (isinstance(value, str) and value.strip()):
        raise ConfigError(f"{where}: the prompt must be a non-empty string, got {value!r:.80}")
    return value


class Columns:
    """Where a row's prompt and gold answer come from (the data section's mapping, checked against the
    dataset's columns)."""

    def __init__(self, cfg_data, names: list[str], source: str, field: str = "data"):
        cols = dict(cfg_data.columns)  # `field`: the section an error names (data, or data.mix[i] for a mix's source)
        self.template = cfg_data.prompt_template
        self.prompt = cols.get("prompt", cfg_data.prompt_column)
        if self.template is not None:
            missing = [f for f in template_fields(self.template, f"{field}.prompt_template") if f not in names]
            if missing:
                raise ConfigError(f"{field}.prompt_template: names {missing}, not columns of {source!r}; "
                                  f"its columns: {names}")
        elif self.prompt not in names:
            where = f"{field}.columns.prompt" + ("" if "prompt" in cols else " (default: data.prompt_column)")
            raise ConfigError(f"{where}: {source!r} has no column {self.prompt!r}; its columns: {names} "
                              f"(or write the prompt with {field}.prompt_template)")
        if "answer" in cols:  # null: the dataset's answers are not gold answers (no verifier)
            self.answer = cols["answer"]
        else:
            self.answer = next((c for c in ANSWER_COLUMNS if c in names), None)
        if self.answer is not None and self.answer not in names:
            raise ConfigError(f"{field}.columns.answer: {source!r} has no column {self.answer!r}; its columns: {names}")
        if self.answer is None and cfg_data.answer_extractor != "auto":
            raise ConfigError(f"{field}.answer_extractor {cfg_data.answer_extractor!r} needs an answer column: set "
                              f"{field}.columns.answer to one of {names}")
        self.extract = ANSWER_EXTRACTORS[cfg_data.answer_extractor]
        self.extractor = cfg_data.answer_extractor
        self.field = field

    def row(self, raw: dict, where: str) -> dict | None:
        """One dataset row as a task row: its columns, `prompt`, and `gold` (+ `answer`) when it has one.
        None: a row whose answer column is null or empty (no gold to verify against: the caller drops it)."""
        row = dict(raw)
        if self.template is not None:
            row["prompt"] = prompt_text(render(self.template, raw, f"{self.field}.prompt_template ({where})"), where)
        else:
            row["prompt"] = prompt_text(raw[self.prompt], f"{where}, column {self.prompt!r}")
        if self.answer is not None:
            if raw[self.answer] is None or (isinstance(raw[self.answer], str) and not raw[self.answer].strip()):
                return None
            gold = self.extract(raw[self.answer])
            if not gold:
                raise ConfigError(f"{self.field}.answer_extractor {self.extractor!r}: {where}: no answer in column "
                                  f"{self.answer!r} ({str(raw[self.answer])[-80:]!r}); "
                                  f"the extractors: {sorted(ANSWER_EXTRACTORS)}")
            row["gold"] = gold
            row.setdefault("answer", gold)
        return row


def split_indices(n: int, num_train: int, num_eval: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, held-out) row indices of one split: a seeded `fraction` of its rows held out (none when
    num_eval is 0), then up to num_train / num_eval of each, in a seeded order.

    >>> train, held = split_indices(100, 1000, 1000, 0.1, seed=0)
    >>> len(train), len(held), set(train) & set(held)
    (90, 10, set())
    """
    order = list(range(n))
    random.Random(f"dataset-{seed}").shuffle(order)
    n_held = 0 if num_eval == 0 or fraction == 0 else min(n - 1, max(1, round(n * fraction)))
    return order[n_held:][:num_train], order[:n_held][:num_eval]


def sample_indices(n: int, k: int, seed: int, what: str) -> list[int]:
    """Up to k of n row indices in a seeded order (`what`: which split's draw, so train and test differ)."""
    order = list(range(n))
    random.Random(f"dataset-{what}-{seed}").shuffle(order)
    return order[:k]


def dataset_rows(cfg_data, field: str = "data") -> tuple[list[dict], list[dict], Task | None]:
    """(train rows, held-out rows, the verifier task or None) of `data.dataset` (see the module docstring);
    `field`: the section its errors name (`data`, or `data.mix[i]` for one source of a mix: tinyrl.tasks.mix)."""
    source, split, eval_split = cfg_data.dataset, cfg_data.split, cfg_data.eval_split
    splits = load_splits(source, cfg_data.config, [split] + ([eval_split] if eval_split else []), field)
    train_ds = splits[split]
    cols = Columns(cfg_data, list(train_ds.column_names), source, field)
    if eval_split:
        eval_ds = splits[eval_split]
        Columns(cfg_data, list(eval_ds.column_names), f"{source}, split {eval_split}", field)
        train_idx = sample_indices(len(train_ds), cfg_data.num_train, cfg_data.seed, "train")
        held_idx, held_ds = sample_indices(len(eval_ds), cfg_data.num_eval, cfg_data.seed, "eval"), eval_ds
    else:
        train_idx, held_idx = split_indices(len(train_ds), cfg_data.num_train, cfg_data.num_eval,
                                            cfg_data.eval_fraction, cfg_data.seed)
        held_ds = train_ds
    if not train_idx:
        raise ConfigError(f"{field}.dataset: {source!r}, split {split!r} has no rows to train on "
                          f"({len(train_ds)} rows, data.eval_fraction {cfg_data.eval_fraction})")
    train = _rows(cols, split, train_idx, take_rows(train_ds, train_idx), source)
    if not train:
        raise ConfigError(f"{field}.columns.answer: every row of {source!r}, split {split!r} that was drawn has a null "
                          f"or empty {cols.answer!r}: nothing to verify against (data.columns.answer: null trains "
                          f"on your reward functions alone)")
    held = _rows(cols, eval_split or f"{split} (held out)", held_idx, take_rows(held_ds, held_idx), source)
    return train, held, (TASK if cols.answer is not None else None)


def _rows(cols: Columns, split: str, idx: list[int], raws, source: str) -> list[dict]:
    """Task rows of one split; rows with no answer are dropped, with one warning naming how many and which."""
    rows, empty = [], []
    for i, raw in zip(idx, raws):
        row = cols.row(raw, f"split {split!r}, row {i}")
        (rows if row is not None else empty).append(row if row is not None else i)
    if empty:
        log.warning("data.dataset %r, split %r: %d of %d rows have a null or empty answer column %r and were "
                    "left out (rows %s)", source, split, len(empty), len(idx), cols.answer,
                    ", ".join(map(str, empty[:10])) + (", ..." if len(empty) > 10 else ""))
    return rows


class DatasetTask(Task):
    """The verifier of dataset rows: the completion's one final answer equals the row's `gold` by value."""

    def reward(self, prompts: list[str], completions: list[str], **columns: list[Any]) -> list[float | None]:
        """math_strict against each row's gold, in one batch (None where the check timed out)."""
        return math_scores(prompts, completions, columns["gold"])["strict"]


def is_correct(completion: str, row: dict) -> bool:
    """The completion's one marked final answer equals the row's gold by value.

    >>> is_correct("so \\\\boxed{0.5}", {"prompt": "Half of 1?", "gold": "1/2"})
    True
    """
    return bool(math_scores([row.get("prompt")], [completion], [row["gold"]])["strict"][0])


def answer_of(completion: str, row: dict) -> str | None:
    """The final answer `is_correct` grades, normalised for majority voting (maj@k): gsm8k's rule,
    with the row's prompt as the question whose echo is cut.

    >>> [answer_of(c, {"prompt": "q"}) for c in ("\\\\boxed{18.0}", "#### 1,200", "no answer")]
    ['18', '1200', None]
    """
    return gsm8k_answer_of(completion, {"question": row.get("prompt")})


def _build(*_a, **_kw):
    raise ConfigError("the 'dataset' task builds its rows from the data section: use tinyrl.data.load_rows")


TASK = DatasetTask(
    name="dataset",
    description="rows of data.dataset (a hub id or a local jsonl/json/parquet/csv/save_to_disk path), "
                "the gold answer from data.columns.answer, verified by value (\\boxed{}, ####, <answer>)",
    build=_build,
    is_correct=is_correct,
    answer_of=answer_of,
)
