"""SFT rows: where they come from (`sft.data`) and how they become token ids.

Rows come from `sft.data` (see `sft_rows`): a jsonl file of prompt/completion rows, a run
folder's samples.jsonl filtered by reward, the task's own train rows, or (agent presets) the
task's expert demonstrations replayed through the run's tools.

Rows are tokenized the way the rollout engine sees them: the prompt rendered as at rollout (the
chat template, plus an agent format's instructions and tools) and encoded alone without special
tokens, the completion encoded alone and closed with EOS. So no token merges across the prompt /
completion boundary and the GRPO stage that follows samples from exactly the context SFT trained
on. A demonstration's tool observations are 0 in `completion_mask`, as they are in the GRPO loss
mask: the model learns its own turns, never the tool's text.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from tinyrl.agents.demonstrations import DEMONSTRATIONS
from tinyrl.data import load_rows as task_rows
from tinyrl.data import render_prompt
from tinyrl.errors import ConfigError
from tinyrl.rollout.agent import AgentEngine
from tinyrl.runs import read_jsonl

log = logging.getLogger("tinyrl.sft")


def sft_rows(cfg) -> list[dict]:
    """The SFT rows `cfg.sft` names: dicts with `completion` and `prompt` (raw) or `rendered`.

    - a jsonl file: its `prompt_column` / `completion_column` ("completion"); rows with a
      `reward` below `min_reward` (when set) are dropped;
    - a run folder: its samples.jsonl rows whose `reward` >= `min_reward` (their prompts are
      already rendered as the run's engine saw them);
    - null: the task's train rows (`data.*`), completion from `completion_column` ("answer");
    - "demonstrations": the task's expert steps for its train rows (`Task.demonstrate`), each row
      {"prompt", "steps", "row"}: `tokenize` replays them through the agent's tools.
    """
    s = cfg.sft
    if s.data == DEMONSTRATIONS:
        return cap_per_prompt(demonstration_rows(cfg), s.max_per_prompt)
    if s.data is None:
        column = s.completion_column or "answer"
        train, _, _ = task_rows(cfg.data)
        missing = [i for i, r in enumerate(train) if column not in r]
        if missing:
            raise ConfigError(f"sft.completion_column: train row {missing[0]} of data.task {cfg.data.task!r} "
                             f"has no {column!r} column to learn (columns: {sorted(train[missing[0]])})")
        rows = [{"prompt": r["prompt"], "completion": str(r[column])} for r in train]
    elif Path(s.data).is_dir():
        rows = [{"rendered": r["rendered"] if "rendered" in r else r["prompt"], "completion": r["completion"],
                 "reward": r.get("reward")} for r in read_jsonl(Path(s.data) / "samples.jsonl")]
    else:
        rows = _file_rows(Path(s.data), s.prompt_column, s.completion_column or "completion")
    return cap_per_prompt(filter_reward(rows, s.min_reward), s.max_per_prompt)


def demonstration_rows(cfg) -> list[dict]:
    """The task's expert steps for each train row it can demonstrate (ConfigError when it has none)."""
    if not cfg.agent.enabled:
        raise ConfigError("sft.data: demonstrations are agent trajectories; they need agent.enabled: true "
                          "(and an agent task, e.g. data.task: search_qa)")
    train, _, task = task_rows(cfg.data)
    if task is None or task.demonstrate is None:
        raise ConfigError(f"sft.data: the {cfg.data.task!r} task has no expert demonstrations "
                          f"(tasks that have them: search_qa); give a jsonl file or a run folder instead")
    rows = [{"prompt": r["prompt"], "steps": steps, "row": r} for r in train if (steps := task.demonstrate(r))]
    if not rows:
        raise ConfigError(f"sft.data: the {cfg.data.task!r} task could demonstrate none of its {len(train)} train rows "
                          f"(its demonstrations know the shipped world's questions only)")
    return rows


def _file_rows(path: Path, prompt_col: str, completion_col: str) -> list[dict]:
    rows = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        r = json.loads(line)
        for col in (prompt_col, completion_col):
            if col not in r:
                raise ConfigError(f"sft.data: row {i} of {path} has no {col!r} column (columns: {sorted(r)})")
        rows.append({"prompt": r[prompt_col], "completion": r[completion_col], "reward": r.get("reward")})
    return rows


def filter_reward(rows: list[dict], min_reward: float | None) -> list[dict]:
    """Rows whose `reward` is >= min_reward (None keeps all; a row without a reward fails a threshold).

    >>> filter_reward([{"reward": 1.0}, {"reward": 0.0}, {"reward": None}], 1.0)
    [{'reward': 1.0}]
    """
    if min_reward is None:
        return rows
    return [r for r in rows if isinstance(r.get("reward"), (int, float)) and r["reward"] >= min_reward]


def cap_per_prompt(rows: list[dict], cap: int | None) -> list[dict]:
    """At most `cap` rows per prompt, distinct completions first, in their order.

    >>> rows = [{"prompt": "p", "completion": c} for c in ["a", "a", "b", "c"]]
    >>> [r["completion"] for r in cap_per_prompt(rows, 2)], len(cap_per_prompt(rows, None))
    (['a', 'b'], 4)
    """
    if cap is None:
        return rows
    by_prompt: dict[str, list[dict]] = {}
    for r in rows:
        by_prompt.setdefault(r.get("rendered", r.get("prompt")), []).append(r)
    out = []
    for group in by_prompt.values():
        seen, firsts, repeats = set(), [], []
        for r in group:
            (repeats if r["completion"] in seen else firsts).append(r)
            seen.add(r["completion"])
        out.extend((firsts + repeats)[:cap])
    return out


def tokenize(rows: list[dict], tokenizer, cfg_data, agent=None, budget: int | None = None):
    """A `datasets.Dataset` of `input_ids` + `completion_mask` (1 on completion tokens and EOS).

    `agent` (an `AgentEngine`; `agent_for` builds the run's) renders prompts with its format's
    instructions and replays demonstration rows (`steps`) through its tools: their observation
    tokens get 0. A demonstration longer than `budget` (rollout.max_new_tokens) is dropped, with
    a warning: no rollout could produce it."""
    from datasets import Dataset  # the sft extra (TRL's dependency): imported when SFT runs

    render = (lambda text: agent.render(text, cfg_data)) if agent is not None else (
        lambda text: render_prompt(tokenizer, text, cfg_data))
    eos = tokenizer.eos_token_id
    out = {"input_ids": [], "completion_mask": []}
    too_long = 0
    for r in rows:
        rendered = r["rendered"] if "rendered" in r else render(r["prompt"])
        p = tokenizer(rendered, add_special_tokens=False)["input_ids"]
        if "steps" in r:
            if agent is None:
                raise ConfigError("sft.data: demonstrations are agent trajectories; they need agent.enabled: true")
            replayed = agent.replay(p, r["row"], r["steps"], budget or 1 << 30)
            if replayed is None:
                too_long += 1
                continue
            c, obs = replayed
            mask = [1 - o for o in obs]
        else:
            c = tokenizer(r["completion"], add_special_tokens=False)["input_ids"]
            if not c or c[-1] != eos:
                c = c + [eos]  # the completion ends where the engine stops: EOS
            mask = [1] * len(c)
        out["input_ids"].append(p + c)
        out["completion_mask"].append([0] * len(p) + mask)
    if too_long:
        log.warning("sft: %d of %d demonstrations are longer than rollout.max_new_tokens=%s and were dropped",
                    too_long, len(rows), budget)
    if not out["input_ids"]:
        raise ConfigError(f"sft.data: every demonstration is longer than rollout.max_new_tokens={budget}; raise it")
    return Dataset.from_dict(out)


def agent_for(cfg, tokenizer, task=None):
    """The run's `AgentEngine` for rendering and replay (no sampling engine under it), or None
    when the preset has no agent."""
    if not cfg.agent.enabled:
        return None
    if task is None:
        task = task_rows(cfg.data)[2]
    return AgentEngine.from_config(None, tokenizer, cfg.agent, task)
