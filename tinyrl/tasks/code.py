"""The built-in "code" task: write Python that passes the grader's unit tests, run in the sandbox.

Rows come in three formats, told apart by their columns:

- MBPP: the description in `text` (or `prompt`, as in MBPP's `sanitized` config), the tests in
  `test_list` (assert statements) or `test` (their text), an optional `entry_point` (else the
  function the first assert calls), `test_setup_code` and `test_imports` (run before the asserts);
- HumanEval: `prompt` (the signature and docstring), `test` with `def check(candidate)`, and
  `entry_point`; the prompt's import lines are put before the completion's code;
- stdin/stdout: `input_output` (APPS: JSON text of {"inputs": [...], "outputs": [...]}) or
  `inputs` / `outputs` lists, the description in `question` / `text` / `prompt` / `description`.

Where from (`data.task_args`): nothing: the shipped code world (`tinyrl/assets/code-world`,
`train.jsonl` and the held-out `test.jsonl`); `path`: a .jsonl / .json / .parquet file, or a folder
holding `train*` and optionally `test*` files; `dataset`: a hub id (or anything `data.dataset`
takes) through `datasets` (tinyrl.datasets_source), with `config`, `split` (default train) and
`eval_split` (default test). Held out: the test file or split; without one, a seeded
`eval_fraction` of the problems, chosen by task_id (a problem is never in both).

The prompt asks for one fenced Python block: `template: default` (per format: the MBPP
description with one of its asserts, the HumanEval stub, the stdin/stdout statement), `template:
plain` (PLAIN_PROMPT: the bare description, the fence already opened; the completion is the code up
to the closing fence; pair it with `rollout.stop: ["```"]`), or `prompt`, a format string over
{text}, {entry_point} and {example} (the first test).

`is_correct`: every one of the grader's checks passes in the sandbox (`tinyrl.rewards.sandbox`);
the task's reward is the fraction passed (`reward: fraction`) or 1/0 (`reward: all_pass`), 0 for no
code, a timeout, a crash, an early exit or too much output, None where the sandbox could not run.
Each reward call tallies its sandbox outcomes into the step's metrics (`tinyrl.rewards.code`).
Sandbox settings: `cpu_s`, `wall_s`, `memory_mb`, `weak_isolation` (see docs/rewards.md). There is
no final answer to vote on: `answer_of` is None (`tinyrl eval` reports pass@1 and pass@k).
"""

from __future__ import annotations

import ast
import builtins
import json
import random
import re
import time
import zlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from tinyrl.datasets_source import load_splits
from tinyrl.errors import ConfigError
from tinyrl.rewards.code import extract_code, run_completions, tally_outcomes
from tinyrl.rewards.sandbox import Limits, run_tests
from tinyrl.tasks.base import Task

# The prompt of `template: plain` (the tiny code model is pretrained on it: do not change it).
PLAIN_PROMPT = "{text}\n```python\n"
ASK = "Answer with one ```python code block."
TEMPLATES = {
    "mbpp": "{text}\nYour code should pass tests like this one:\n{example}\n" + ASK,
    "humaneval": "Complete this Python function:\n```python\n{text}\n```\nWrite the whole function. " + ASK,
    "io": "{text}\nWrite a Python program that reads standard input and prints the answer. " + ASK,
}
REWARDS = ("fraction", "all_pass")
_SUFFIXES = (".jsonl", ".json", ".parquet")
_DESCRIPTION = ("text", "prompt", "question", "description")
_IMPORT = re.compile(r"^(?:import |from \S+ import )", re.MULTILINE)
_OPENS_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n?\Z", re.IGNORECASE)  # a prompt that ends inside a block


def world_dir():
    return resources.files("tinyrl.assets") / "code-world"


# ----------------------------------------------------------------------------- rows


def _first_call(tests: list[str]) -> str | None:
    """The first non-builtin function the asserts call (MBPP's entry point when the row names none)."""
    for t in tests:
        try:
            tree = ast.parse(t)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not hasattr(builtins, node.func.id):
                return node.func.id
    return None


def _io_cases(raw: dict) -> dict | None:
    if raw.get("input_output"):
        io = raw["input_output"]
        return json.loads(io) if isinstance(io, str) else io
    if raw.get("inputs") is not None and raw.get("outputs") is not None:
        return {"inputs": list(raw["inputs"]), "outputs": list(raw["outputs"])}
    return None


def normalize(raw: dict, where: str) -> dict:
    """One row of any of the three formats as {kind, text, tests, entry_point, code_prefix, task_id}."""
    io = _io_cases(raw)
    test = raw.get("test")
    task_id = str(raw.get("task_id", raw.get("problem_id", raw.get("id", ""))))
    example = ""  # MBPP: the first assert, shown in the default prompt
    if io is not None:
        if len(io.get("inputs", [])) != len(io.get("outputs", [])) or not io.get("inputs"):
            raise ValueError(f"code: {where}: its stdin/stdout cases need as many inputs as outputs (at least one)")
        text = next((raw[k] for k in _DESCRIPTION if raw.get(k)), None)
        kind, tests, entry, prefix = "io", io, None, ""
    elif isinstance(test, str) and "def check(" in test:
        text, entry = raw.get("prompt"), raw.get("entry_point")
        if not entry:
            raise ValueError(f"code: {where}: a HumanEval row (its test defines check(candidate)) needs 'entry_point'")
        kind, tests, prefix = "humaneval", test, "".join(ln + "\n" for ln in str(text or "").splitlines()
                                                          if _IMPORT.match(ln))
    elif raw.get("test_list") or test:
        asserts = list(raw["test_list"]) if raw.get("test_list") else str(test).splitlines()
        setup = "\n".join([*(raw.get("test_imports") or []), str(raw.get("test_setup_code") or "")]).strip()
        text = raw.get("text") or raw.get("prompt")
        entry = raw.get("entry_point") or _first_call(asserts)
        asserts = [a for a in asserts if a.strip()]
        kind, tests, prefix, example = "mbpp", ([setup] if setup else []) + asserts, "", asserts[0] if asserts else ""
    else:
        raise ValueError(f"code: {where} has no tests: an MBPP row has 'test_list' (or 'test'), a HumanEval row "
                         f"'test' with def check(candidate), a stdin/stdout row 'input_output' or 'inputs'/'outputs'; "
                         f"it has {sorted(raw)[:12]}")
    if not text:
        raise ValueError(f"code: {where} has no description (one of {list(_DESCRIPTION)})")
    return {"kind": kind, "text": str(text), "tests": tests, "entry_point": entry, "code_prefix": prefix,
            "task_id": task_id or str(zlib.crc32(str(text).encode())),
            "example": example}


def _read(path: Path) -> list[dict]:
    if path.suffix == ".jsonl":
        return [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, list) else data.get("rows", data.get("data", []))
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ValueError("code: reading .parquet needs pyarrow (pip install pyarrow), or give a .jsonl file") from e
    return pq.read_table(path).to_pylist()


def _find(folder: Path, stem: str) -> Path | None:
    hits = sorted(p for suffix in _SUFFIXES for p in folder.glob(f"{stem}*{suffix}"))
    return hits[0] if hits else None


def _local(path: str, test_path: str | None) -> tuple[list[dict], list[dict] | None]:
    p = Path(path).expanduser()
    if p.is_dir():
        train = _find(p, "train")
        if train is None:
            raise ConfigError(f"data.task_args.path: no train*{{{','.join(_SUFFIXES)}}} file in {p}")
        test = Path(test_path).expanduser() if test_path else _find(p, "test")
    elif p.is_file():
        if p.suffix not in _SUFFIXES:
            raise ConfigError(f"data.task_args.path: {p} must be one of {list(_SUFFIXES)} (or a folder)")
        train, test = p, Path(test_path).expanduser() if test_path else None
    else:
        raise ConfigError(f"data.task_args.path: file or folder not found: {p}")
    return _read(train), _read(test) if test is not None else None


def _hub(dataset: str, config: str | None, split: str, eval_split: str | None) -> tuple[list[dict], list[dict] | None]:
    splits = load_splits(dataset, config, None, field="data.task_args")
    if split not in splits:
        raise ConfigError(f"data.task_args.split: {dataset!r} has no split {split!r}; its splits: {sorted(splits)}")
    held = splits[eval_split].to_list() if eval_split and eval_split in splits and eval_split != split else None
    return splits[split].to_list(), held


def _held_out(task_id: str, seed: int, fraction: float) -> bool:
    return zlib.crc32(f"code-{seed}-{task_id}".encode()) % 10_000 < fraction * 10_000


def _render(row: dict, template: str, prompt: str | None) -> str:
    fmt = prompt if prompt is not None else PLAIN_PROMPT if template == "plain" else TEMPLATES[row["kind"]]
    try:
        return fmt.format(text=row["text"].rstrip("\n"), entry_point=row["entry_point"] or "", example=row["example"])
    except (KeyError, IndexError) as e:
        raise ConfigError(f"data.task_args.prompt: unknown field {e} in {fmt!r}; it may use {{text}}, "
                          "{entry_point} and {example}") from None


def build(num_train: int, num_eval: int, seed: int = 0, path: str | None = None, test_path: str | None = None,
          dataset: str | None = None, config: str | None = None, split: str = "train", eval_split: str | None = "test",
          eval_fraction: float = 0.1, template: str = "default", prompt: str | None = None,
          reward: str = "fraction", cpu_s: float = 2.0, wall_s: float = 5.0, memory_mb: int = 512,
          weak_isolation: bool = False) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows), each a normalised problem with its rendered `prompt` and sandbox settings."""
    if template not in ("default", "plain"):
        raise ConfigError(f"data.task_args.template: must be one of ['default', 'plain'], got {template!r}")
    if reward not in REWARDS:
        raise ConfigError(f"data.task_args.reward: must be one of {list(REWARDS)}, got {reward!r}")
    if not 0 <= eval_fraction < 1:
        raise ConfigError(f"data.task_args.eval_fraction: must be in [0, 1), got {eval_fraction}")
    if path and dataset:
        raise ConfigError("data.task_args: give `path` (local files) or `dataset` (a hub id), not both")
    if dataset:
        train_raw, held_raw = _hub(dataset, config, split, eval_split)
    else:
        folder = path or str(world_dir())
        train_raw, held_raw = _local(folder, test_path)
    train = [normalize(r, f"row {i} of the training rows") for i, r in enumerate(train_raw)]
    if held_raw is None:
        held = [r for r in train if _held_out(r["task_id"], seed, eval_fraction)]
        train = [r for r in train if not _held_out(r["task_id"], seed, eval_fraction)]
    else:
        held = [normalize(r, f"row {i} of the held-out rows") for i, r in enumerate(held_raw)]
    train = random.Random(f"code-train-{seed}").sample(train, min(num_train, len(train)))
    held = random.Random(f"code-eval-{seed}").sample(held, min(num_eval, len(held)))
    sandbox = {"cpu_s": cpu_s, "wall_s": wall_s, "memory_mb": memory_mb, "weak_isolation": weak_isolation}
    out = []
    for rows in (train, held):
        out.append([])
        for r in rows:
            text = _render(r, template, prompt)
            out[-1].append({**r, "prompt": text, "open_fence": bool(_OPENS_FENCE.search(text)),
                            "all_pass": reward == "all_pass", "sandbox": sandbox})
    return out[0], out[1]


# ----------------------------------------------------------------------------- verifier


def code_of(completion: str, row: dict) -> str | None:
    """The code a completion gives for `row`: after an opened fence (template plain) the text up to the
    closing fence, else its last fenced ```python block; None when there is none.

    >>> code_of("def f():\\n    return 1\\n```\\nmore", {"open_fence": True})
    'def f():\\n    return 1\\n'
    >>> code_of("no code", {"open_fence": False}) is None
    True
    """
    code = completion.split("```")[0] if row.get("open_fence") else extract_code(completion)
    if not code or not code.strip():
        return None
    return row.get("code_prefix", "") + code


def _limits(row: dict) -> tuple[Limits, bool]:
    s = row.get("sandbox") or {}
    return Limits(cpu_s=s.get("cpu_s", 2.0), wall_s=s.get("wall_s", 5.0), memory_mb=s.get("memory_mb", 512)), \
        bool(s.get("weak_isolation", False))


def is_correct(completion: str, row: dict) -> bool:
    """Every one of the grader's checks passes in the sandbox."""
    code = code_of(completion, row)
    if code is None:
        return False
    limits, weak = _limits(row)
    r = run_tests(code, row["tests"], row.get("entry_point"), limits, weak_isolation=weak)
    return r.status == "ok" and r.score == 1.0


@dataclass
class CodeTask(Task):
    def reward(self, prompts: list[str], completions: list[str], partial: bool | None = None,
               weak_isolation: bool | None = None, **columns: list[Any]) -> list[float | None]:
        """The fraction of the grader's checks passed (1/0 with `reward: all_pass`), the batch's completions
        run a few at a time; None where the sandbox could not run (the model is not at fault). `partial` and
        `weak_isolation` (a preset's `reward.functions: [{name: task, kwargs: {...}}]`, as for `code_tests`)
        override the task args."""
        rows = [{k: v[i] for k, v in columns.items()} for i in range(len(completions))]
        codes = [code_of(c, r) for c, r in zip(completions, rows)]
        limits, weak = _limits(rows[0]) if rows else (None, False)
        weak = weak if weak_isolation is None else weak_isolation
        t0 = time.perf_counter()
        results = run_completions(codes, [r["tests"] for r in rows], [r.get("entry_point") for r in rows],
                                  limits, weak_isolation=weak)
        tally_outcomes(codes, results, time.perf_counter() - t0)
        out: list[float | None] = []
        for res, row in zip(results, rows):
            if res is None:
                out.append(0.0)
            elif res.status == "error":
                out.append(None)
            else:
                all_pass = row.get("all_pass") if partial is None else not partial
                out.append(float(res.score == 1.0) if all_pass else res.score)
        return out


TASK = CodeTask(
    name="code",
    description="Python problems graded by their unit tests in the sandbox: MBPP, HumanEval and stdin/stdout rows "
                "from the shipped code world, local files (data.task_args.path) or the hub (data.task_args.dataset)",
    build=build,
    is_correct=is_correct,
)
