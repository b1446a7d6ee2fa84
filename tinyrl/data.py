"""Prompts for a run: a built-in task, a local jsonl file, or any dataset (a hub id or a local file or
folder: `data.dataset`, tinyrl/tasks/dataset.py), chat-templated when the model has one.

`PromptSource` hands out batches of rows in a seeded order that is a pure function of
(seed, position), so a resumed run continues with exactly the prompts it would have seen. In a
run of several processes each takes its contiguous share of every batch (`take`): the
single-process order, split by rank.
"""

from __future__ import annotations

import inspect
import json
import logging
import random
from pathlib import Path

from tinyrl.distributed import shard
from tinyrl.errors import ConfigError
from tinyrl.tasks import get_task
from tinyrl.tasks.dataset import dataset_rows
from tinyrl.tasks.mix import mix_rows

log = logging.getLogger("tinyrl.data")


def read_jsonl_rows(path: str, prompt_column: str = "prompt") -> list[dict]:
    """The rows of a local .jsonl file, each with a string `prompt`; ConfigError naming the file and line.

    Every non-blank line must be one JSON object whose `prompt_column` is a non-empty string
    (the user turn; the chat template, if any, is applied later)."""
    where = f"data.path: {path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}: not UTF-8 text (byte {e.start}); a .jsonl file has one JSON object per line") from None
    except OSError as e:
        raise ConfigError(f"{where}: cannot read it ({e.strerror or e})") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}, line {n}: not valid JSON ({e.msg}, column {e.colno})") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{where}, line {n}: expected a JSON object ({{\"{prompt_column}\": ...}}), "
                              f"got {type(row).__name__}")
        prompt = row.get(prompt_column)
        if prompt_column not in row:
            raise ConfigError(f"{where}, line {n}: no {prompt_column!r} column (data.prompt_column); "
                              f"it has {sorted(row)[:10]}")
        if not (isinstance(prompt, str) and prompt.strip()):
            raise ConfigError(f"{where}, line {n}: {prompt_column!r} must be a non-empty string, got {prompt!r:.80}")
        row["prompt"] = prompt
        rows.append(row)
    if not rows:
        raise ConfigError(f"{where}: no rows (the file is empty)")
    return rows


def load_rows(cfg_data) -> tuple[list[dict], list[dict], object | None]:
    """(train rows, held-out rows, task or None). Rows are dicts with a 'prompt' column."""
    if cfg_data.task == "dataset":
        return mix_rows(cfg_data) if cfg_data.mix else dataset_rows(cfg_data)
    if cfg_data.task == "jsonl":
        rows = read_jsonl_rows(cfg_data.path, cfg_data.prompt_column)
        rng = random.Random(cfg_data.seed)
        rng.shuffle(rows)
        n_eval = min(cfg_data.num_eval, len(rows) // 5)
        return rows[n_eval:][: cfg_data.num_train], rows[:n_eval], None
    task = get_task(cfg_data.task)
    args = (cfg_data.num_train, cfg_data.num_eval, cfg_data.seed)
    try:
        inspect.signature(task.build).bind(*args, **cfg_data.task_args)
    except TypeError as e:
        raise ConfigError(f"data.task_args: the {cfg_data.task!r} task does not take {cfg_data.task_args} ({e})") from None
    except ValueError:
        pass  # not inspectable: let the call say
    try:
        train, held_out = task.build(*args, **cfg_data.task_args)
    except ValueError as e:  # the task cannot give what was asked (e.g. more held-out rows than it has)
        raise ConfigError(f"data (task {cfg_data.task!r}): {e}") from None
    return train, held_out, task


class Rows(list):
    """Rows that remember what `data.filter` dropped on the way (`filtered`: summary.json's details.data_filter)."""

    filtered: dict | None = None


def filter_rows(train: list[dict], held_out: list[dict], tokenizer, cfg_data) -> tuple[Rows, list[dict]]:
    """`data.filter` over rows already `rendered` (the prompt as the engine reads it): rows whose prompt has more
    than max_prompt_tokens tokens are dropped, train and held-out alike; each count is logged, and kept in the
    train rows' `filtered`. ConfigError naming the field when no training row is left."""
    limit = cfg_data.filter.max_prompt_tokens
    if limit is None:
        return Rows(train), held_out
    report, kept = {"max_prompt_tokens": limit}, []
    for name, rows in (("train", train), ("held_out", held_out)):
        lengths = [len(ids) for ids in tokenizer([r["rendered"] for r in rows], add_special_tokens=False)["input_ids"]] \
            if rows else []
        kept.append([r for r, n in zip(rows, lengths) if n <= limit])
        report[f"{name}_dropped"], report[f"{name}_kept"] = len(rows) - len(kept[-1]), len(kept[-1])
        if rows and not kept[-1] and name == "train":
            raise ConfigError(f"data.filter.max_prompt_tokens: {limit} drops every training row (the shortest prompt "
                              f"has {min(lengths)} tokens); raise it, or set it to null")
    log.info("data.filter: max_prompt_tokens %d dropped %d of %d training rows and %d of %d held-out rows", limit,
             report["train_dropped"], len(train), report["held_out_dropped"], len(held_out))
    out = Rows(kept[0])
    out.filtered = report
    return out, kept[1]


def render_prompt(tokenizer, text: str, cfg_data) -> str:
    """Apply the tokenizer's chat template (mode auto|always|never) to one user prompt."""
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if cfg_data.chat_template == "never" or (cfg_data.chat_template == "auto" and not has_template):
        return text if cfg_data.system_prompt is None else f"{cfg_data.system_prompt}\n{text}"
    if not has_template:
        raise ConfigError("data.chat_template is 'always' but the tokenizer has no chat template; "
                          "use 'auto' or 'never'")
    messages = [{"role": "user", "content": text}]
    if cfg_data.system_prompt is not None:
        messages.insert(0, {"role": "system", "content": cfg_data.system_prompt})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


class PromptSource:
    """Endless, seeded, epoch-shuffled batches of rows; `position` is all the state it has."""

    def __init__(self, rows: list[dict], seed: int, rank: int = 0, world: int = 1):
        if not rows:
            raise ConfigError("data: no training rows (data.num_train, or the jsonl file, gives none)")
        self.rows = rows
        self.seed = seed
        self.rank, self.world = rank, world
        self.position = 0  # rows handed out so far
        self._cached: tuple[int, list[int]] = (-1, [])

    def _order(self, epoch: int) -> list[int]:
        if self._cached[0] != epoch:
            idx = list(range(len(self.rows)))
            random.Random(self.seed * 7919 + epoch).shuffle(idx)
            self._cached = (epoch, idx)
        return self._cached[1]

    def _row(self, position: int) -> dict:
        epoch, i = divmod(position, len(self.rows))
        return self.rows[self._order(epoch)[i]]

    def row_at(self, position: int) -> dict:
        """The row at a position of the stream (a resumed run's in-flight prompts)."""
        return self._row(position)

    def next_batch(self, k: int) -> list[dict]:
        return self.take(k)[1]

    def take(self, k: int) -> tuple[int, list[dict]]:
        """The next k rows of the stream: (stream position of this process's first row, this
        process's share of the k). Every process advances past all k."""
        first, part = self.position, shard(k, self.rank, self.world)
        self.position += k
        return first + part.start, [self._row(first + i) for i in range(part.start, part.stop)]

    def state_dict(self) -> dict:
        return {"position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.position, self.seed = state["position"], state["seed"]
