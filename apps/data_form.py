"""Data and rewards on the launch form (no gradio): dataset files kept in the runs directory, the columns
of a dataset (for the column-mapping dropdowns), and a preview of what a run will train on: one prompt as
its rollout engine renders it and the reward the task's verifier gives a sample answer.

An uploaded file is copied into `<runs dir>/data/` (the training process reads it from there, after
the browser's upload is gone); `data.dataset` then names that file. A hub id is read through `datasets`
(offline: from its cache), as `tinyrl train` reads it.

>>> answers({"answer": "85"})[:2]
['85', '\\\\boxed{85}']
"""

from __future__ import annotations

import functools
import re
import shutil
from pathlib import Path

from tinyrl.apps.forms import MODEL_STACK
from tinyrl.config import ConfigError
from tinyrl.config.schema import DATA_FILE_SUFFIXES

DATA_DIR = "data"


def data_dir(runs_dir: Path) -> Path:
    return Path(runs_dir) / DATA_DIR


def files(runs_dir: Path) -> list[Path]:
    """The dataset files kept in `<runs dir>/data/`, newest first."""
    d = data_dir(runs_dir)
    found = [p for p in d.iterdir() if p.is_file() and p.suffix.lower() in DATA_FILE_SUFFIXES] if d.is_dir() else []
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def store(runs_dir: Path, uploaded: str | Path) -> Path:
    """Copy an uploaded file into `<runs dir>/data/` under its own (cleaned) name; a taken name gets a number."""
    src = Path(uploaded)
    if src.suffix.lower() not in DATA_FILE_SUFFIXES:
        raise ConfigError(f"data.dataset: {src.name}: not a data file; upload one of {list(DATA_FILE_SUFFIXES)}")
    stem = re.sub(r"[^A-Za-z0-9._-]", "-", src.stem).strip(".-") or "data"
    d = data_dir(runs_dir)
    d.mkdir(parents=True, exist_ok=True)
    dest, i = d / f"{stem}{src.suffix.lower()}", 1
    while dest.exists():
        dest, i = d / f"{stem}-{i}{src.suffix.lower()}", i + 1
    shutil.copyfile(src, dest)
    return dest


def columns(source: str, config: str | None = None, split: str = "train") -> list[str]:
    """The column names of `source` (a file, a folder or a hub id), as `tinyrl train` would load it."""
    from tinyrl.datasets_source import load_splits  # `datasets` (the data extra): loaded when a dataset is named

    return list(load_splits(source, config, [split])[split].column_names)


@functools.lru_cache(maxsize=4)
def _tokenizer(name: str, gguf_file: str | None):
    with MODEL_STACK:
        from tinyrl.model import load_tokenizer, resolve_model  # the model stack: loaded when a preview is asked for

        return load_tokenizer(resolve_model(name, gguf_file))


def answers(row: dict) -> list[str]:
    """Sample answers to try on a row: its gold answer as is, in \\boxed{}, in <answer> tags."""
    golds = [row.get("gold"), row.get("answer"), *(row.get("golden_answers") or [])[:1]]
    out = []
    for g in (str(x) for x in golds if x not in (None, "")):
        out += [g, f"\\boxed{{{g}}}", f"<answer> {g} </answer>"]
    return list(dict.fromkeys(out))


def reward_of(task, row: dict, answer: str) -> float | None:
    """The task's verifier reward of `answer` to `row` (TRL's signature: the row's columns as lists)."""
    cols = {k: [v] for k, v in row.items() if k != "prompt"}
    return task.reward([row["prompt"]], [answer], **cols)[0]


def preview(cfg, sample: str = "") -> dict:
    """The first training row of a validated config: its prompt, the prompt as the run's engine renders it,
    its gold answer, a sample answer (`sample`, else the first of `answers` the verifier accepts) and the
    reward the task's verifier gives it."""
    with MODEL_STACK:  # (the rollout package imports transformers)
        from tinyrl.data import load_rows
        from tinyrl.rollout.engines import prompt_renderer

    train, held_out, task = load_rows(cfg.data)
    if not train:
        raise ConfigError("data: no training rows")
    row = train[0]
    tok = _tokenizer(cfg.model.name, cfg.model.gguf_file)
    rendered = prompt_renderer(cfg, tok, task)(row["prompt"])
    out = {"prompt": row["prompt"], "rendered": rendered, "rows": (len(train), len(held_out)),
           "gold": next((g for g in (row.get("gold"), row.get("answer"), *(row.get("golden_answers") or [])[:1])
                         if g not in (None, "")), None), "columns": sorted(k for k in row if k != "rendered"),
           "task": getattr(task, "name", None), "sample": sample, "reward": None}
    if task is None:
        return out
    tries = [sample] if sample else answers(row)
    for answer in tries or [""]:
        out.update(sample=answer, reward=reward_of(task, row, answer))
        if out["reward"]:
            break
    return out


def preview_text(p: dict) -> str:
    """A preview as the page shows it (markdown)."""
    rendered = p["rendered"].replace("```", "` ` `")
    lines = [f"**preview** of the first of {p['rows'][0]} training rows ({p['rows'][1]} held out), "
             f"task `{p['task'] or 'none'}`; columns: {', '.join(f'`{c}`' for c in p['columns'])}",
             "", "the prompt as the rollout engine sees it:", f"```text\n{rendered}\n```",
             f"gold answer: `{p['gold']}`" if p["gold"] is not None else "no gold answer (no verifier)"]
    if p["task"] is None:
        lines.append("no verifier: the rewards come from reward.functions (none given: every reward is 0)")
    else:
        verdict = "accepts it" if p["reward"] else "rejects it"
        lines.append(f"sample answer `{p['sample']}` → reward **{p['reward']}** (the task's verifier {verdict})")
    return "\n".join(lines)
