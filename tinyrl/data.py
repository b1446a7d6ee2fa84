"""Prompts for a run: a built-in task or a local jsonl file, chat-templated when the model has one.

`PromptSource` hands out batches of rows in a seeded order that is a pure function of
(seed, position), so a resumed run continues with exactly the prompts it would have seen. In a
run of several processes each takes its contiguous share of every batch (`take`): the
single-process order, split by rank.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tinyrl.distributed import shard


def load_rows(cfg_data) -> tuple[list[dict], list[dict], object | None]:
    """(train rows, held-out rows, task or None). Rows are dicts with a 'prompt' column."""
    if cfg_data.task == "jsonl":
        rows = [json.loads(line) for line in Path(cfg_data.path).read_text().splitlines() if line.strip()]
        for i, r in enumerate(rows):
            if cfg_data.prompt_column not in r:
                raise ValueError(f"data.path: row {i} of {cfg_data.path} has no {cfg_data.prompt_column!r} column")
            r["prompt"] = r[cfg_data.prompt_column]
        rng = random.Random(cfg_data.seed)
        rng.shuffle(rows)
        n_eval = min(cfg_data.num_eval, len(rows) // 5)
        return rows[n_eval:][: cfg_data.num_train], rows[:n_eval], None
    from tinyrl.tasks import get_task

    task = get_task(cfg_data.task)
    train, held_out = task.build(cfg_data.num_train, cfg_data.num_eval, cfg_data.seed, **cfg_data.task_args)
    return train, held_out, task


def render_prompt(tokenizer, text: str, cfg_data) -> str:
    """Apply the tokenizer's chat template (mode auto|always|never) to one user prompt."""
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if cfg_data.chat_template == "never" or (cfg_data.chat_template == "auto" and not has_template):
        return text if cfg_data.system_prompt is None else f"{cfg_data.system_prompt}\n{text}"
    if not has_template:
        raise ValueError("data.chat_template is 'always' but the tokenizer has no chat template")
    messages = [{"role": "user", "content": text}]
    if cfg_data.system_prompt is not None:
        messages.insert(0, {"role": "system", "content": cfg_data.system_prompt})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


class PromptSource:
    """Endless, seeded, epoch-shuffled batches of rows; `position` is all the state it has."""

    def __init__(self, rows: list[dict], seed: int, rank: int = 0, world: int = 1):
        if not rows:
            raise ValueError("data: no training rows")
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
