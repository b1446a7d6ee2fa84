"""The built-in "code" task: write Python that passes the grader's unit tests, run in the sandbox.

Rows come in three formats, told apart by their columns:

- MBPP: the description in `text` (or `prompt`, as in MBPP's `sanitized` config), the tests in
  `test_list` (assert statements; one string is ONE test, whose text may hold several statements,
  never a test per character) or `test` (their text), an optional `entry_point` (else the
  function the first assert calls that is not a builtin, else the first it calls: MBPP 126 names
  its function `sum`), `test_setup_code` and `test_imports` (run before the asserts);
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

A row that cannot be read (a column of the wrong type, `input_output` that is not JSON of
{"inputs": [...], "outputs": [...]}, a file that is not a list of objects) is a ConfigError naming
the file, the row, its task_id and the column (the CLI exits 2 before anything is written). Rows
whose tests do not parse, or assert nothing, are left out, named in ONE warning (row and task_id);
with none left, a ConfigError. The task args are checked first (`check_args`: unknown names, the
choices, the sandbox limits' ranges, a `prompt` that names only {text}, {entry_point}, {example}).

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
import inspect
import json
import logging
import random
import re
import string
import time
import zlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from tinyrl.datasets_source import load_splits
from tinyrl.errors import ConfigError
from tinyrl.rewards.code import extract_code, run_completions, tally_outcomes
from tinyrl.rewards.sandbox import Limits, check_limits, parse_tests, run_tests
from tinyrl.tasks.base import Task

log = logging.getLogger("tinyrl.tasks.code")
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
    """The first non-builtin function the asserts call (MBPP's entry point when the row names none); when
    they call only builtins, the first of those (MBPP task 126 names its function `sum`).

    >>> _first_call(["assert len(pairs([1])) == 1"]), _first_call(["assert sum(10, 15) == 6"])
    ('pairs', 'sum')
    """
    called = []
    for t in tests:
        try:
            tree = ast.parse(t)
        except SyntaxError:
            continue
        called += [node.func.id for node in ast.walk(tree)
                   if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)]
    return next((name for name in called if not hasattr(builtins, name)), called[0] if called else None)


def _strings(raw: dict, field: str, where: str) -> list[str]:
    """A column of test code: a list of strings, or one string taken as ONE test (its text may hold several
    statements; never split into characters); missing or null: []."""
    v = raw.get(field)
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    if isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
        return list(v)
    raise ConfigError(f"code: {where}: {field!r} must be a list of strings (or one string), got {v!r:.80}")


def _io_cases(raw: dict, where: str) -> dict | None:
    """{"inputs": [...], "outputs": [...]} of a stdin/stdout row (checked), or None for another format."""
    if raw.get("input_output"):
        io, field = raw["input_output"], "input_output"
        if isinstance(io, str):
            try:
                io = json.loads(io)
            except ValueError as e:
                raise ConfigError(f"code: {where}: 'input_output' is not valid JSON ({e})") from None
    elif raw.get("inputs") is not None and raw.get("outputs") is not None:
        io, field = {"inputs": raw["inputs"], "outputs": raw["outputs"]}, "inputs/outputs"
    else:
        return None
    if not isinstance(io, dict) or "fn_name" in io:
        why = "call-based APPS rows (fn_name) are not supported" if isinstance(io, dict) else f"got {io!r:.80}"
        raise ConfigError(f"code: {where}: {field!r} must be {{\"inputs\": [...], \"outputs\": [...]}} of stdin/stdout "
                          f"strings; {why}")
    ins, outs = io.get("inputs"), io.get("outputs")
    if not (isinstance(ins, list) and isinstance(outs, list) and ins and len(ins) == len(outs)
            and all(isinstance(x, str) for x in ins + outs)):
        raise ConfigError(f"code: {where}: {field!r}: its stdin/stdout cases need as many inputs as outputs (at least "
                          f"one), each a string; got {ins!r:.60} and {outs!r:.60}")
    return {"inputs": ins, "outputs": outs}


def normalize(raw: dict, where: str) -> dict:
    """One row of any of the three formats as {kind, text, tests, entry_point, code_prefix, task_id}; a row that
    cannot be read is a ConfigError naming it (`where`, its task id) and the field."""
    if not isinstance(raw, dict):
        raise ConfigError(f"code: {where} must be an object of the row's columns, got {type(raw).__name__} {raw!r:.60}")
    task_id = str(raw.get("task_id", raw.get("problem_id", raw.get("id", ""))))
    where = f"{where} (task_id {task_id})" if task_id else where
    io = _io_cases(raw, where)
    test = raw.get("test")
    if test is not None and not isinstance(test, str):
        raise ConfigError(f"code: {where}: 'test' must be a string of test code, got {test!r:.80}")
    for field in ("entry_point", "test_setup_code", *_DESCRIPTION):
        if raw.get(field) is not None and not isinstance(raw[field], str):
            raise ConfigError(f"code: {where}: {field!r} must be a string, got {raw[field]!r:.80}")
    example = ""  # MBPP: the first assert, shown in the default prompt
    if io is not None:
        text = next((raw[k] for k in _DESCRIPTION if raw.get(k)), None)
        kind, tests, entry, prefix = "io", io, None, ""
    elif test and "def check(" in test:
        text, entry = raw.get("prompt"), raw.get("entry_point")
        if not entry:
            raise ConfigError(f"code: {where}: a HumanEval row (its test defines check(candidate)) needs 'entry_point'")
        kind, tests, prefix = "humaneval", test, "".join(ln + "\n" for ln in str(text or "").splitlines()
                                                          if _IMPORT.match(ln))
    elif raw.get("test_list") or test:
        asserts = _strings(raw, "test_list", where) if raw.get("test_list") else test.splitlines()
        setup = "\n".join([*_strings(raw, "test_imports", where), raw.get("test_setup_code") or ""]).strip()
        text = raw.get("text") or raw.get("prompt")
        entry = raw.get("entry_point") or _first_call(asserts)
        asserts = [a for a in asserts if a.strip()]
        kind, tests, prefix, example = "mbpp", ([setup] if setup else []) + asserts, "", asserts[0] if asserts else ""
    else:
        raise ConfigError(f"code: {where} has no tests: an MBPP row has 'test_list' (or 'test'), a HumanEval row "
                          f"'test' with def check(candidate), a stdin/stdout row 'input_output' or 'inputs'/'outputs'; "
                          f"it has {sorted(map(str, raw))[:12]}")
    if not text:
        raise ConfigError(f"code: {where} has no description (one of {list(_DESCRIPTION)})")
    return {"kind": kind, "text": str(text), "tests": tests, "entry_point": entry, "code_prefix": prefix,
            "task_id": task_id or str(zlib.crc32(str(text).encode())),
            "example": example}


def _runnable(rows: list[dict], what: str) -> list[dict]:
    """The rows whose tests the grader can run; the others are left out, named in ONE warning (else every
    sample of theirs would be excluded at reward time, one anonymous warning per sample)."""
    good, bad = [], []
    for i, r in enumerate(rows):
        try:
            why = None if parse_tests(r["tests"], r["entry_point"])[1] else "no check (nothing asserted)"
        except (SyntaxError, ValueError, TypeError, KeyError, RecursionError, MemoryError) as e:
            why = f"{type(e).__name__}: {e}"
        if why:
            bad.append(f"row {i} (task_id {r['task_id']}): {why[:120]}")
        else:
            good.append(r)
    if bad:
        more = f"; and {len(bad) - 10} more" if len(bad) > 10 else ""
        log.warning("code: %d of %d %s have tests the grader cannot run and are left out: %s%s", len(bad), len(rows),
                    what, "; ".join(bad[:10]), more)
    return good


def _read(path: Path) -> list[dict]:
    """The rows of one .jsonl / .json ({"rows": [...]} or {"data": [...]} too) / .parquet file: a list of objects."""
    where = f"data.task_args.path: {path}"
    if not path.is_file():  # a FIFO or a device would block or never end
        raise ConfigError(f"{where}: not a regular file")
    try:
        if path.suffix == ".parquet":
            try:
                import pyarrow.parquet as pq
            except ImportError:
                raise ConfigError("code: reading .parquet needs pyarrow (pip install pyarrow), or give a .jsonl file") from None
            rows = pq.read_table(path).to_pylist()
        elif path.suffix == ".jsonl":
            rows = []
            for n, ln in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                try:
                    rows += [json.loads(ln)] if ln.strip() else []
                except ValueError as e:
                    raise ConfigError(f"{where}, line {n}: not valid JSON ({e})") from None
        else:
            try:
                rows = json.loads(path.read_text(encoding="utf-8"))
            except ValueError as e:
                raise ConfigError(f"{where}: not valid JSON ({e})") from None
            if isinstance(rows, dict) and ("rows" in rows or "data" in rows):
                rows = rows.get("rows", rows.get("data"))
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: cannot read it ({e})") from None
    if not isinstance(rows, list):
        raise ConfigError(f"{where}: must hold a list of rows (or {{\"rows\": [...]}}), got {type(rows).__name__} "
                          f"{rows!r:.60}")
    for k, r in enumerate(rows):
        if not isinstance(r, dict):
            raise ConfigError(f"{where}: row {k} must be an object of the row's columns, got {type(r).__name__} {r!r:.60}")
    if not rows:
        raise ConfigError(f"{where}: no rows")
    return rows


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
    elif p.exists():
        raise ConfigError(f"data.task_args.path: {p} is not a regular file or a folder")
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
    args = dict(locals())
    check_args({k: v for k, v in args.items() if k in TASK_ARGS})
    if dataset:
        train_raw, held_raw = _hub(dataset, config, split, eval_split)
    else:
        folder = path or str(world_dir())
        train_raw, held_raw = _local(folder, test_path)
    train = _runnable([normalize(r, f"row {i} of the training rows") for i, r in enumerate(train_raw)], "training rows")
    if not train:
        raise ConfigError("data.task_args: no training row has tests the grader can run (see the warning above)")
    if held_raw is None:
        held = [r for r in train if _held_out(r["task_id"], seed, eval_fraction)]
        train = [r for r in train if not _held_out(r["task_id"], seed, eval_fraction)]
    else:
        held = _runnable([normalize(r, f"row {i} of the held-out rows") for i, r in enumerate(held_raw)],
                         "held-out rows")
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


TASK_ARGS = tuple(inspect.signature(build).parameters)[3:]  # what data.task_args may set (after num_train, num_eval, seed)
_OPTIONAL_STRINGS = ("path", "test_path", "dataset", "config", "eval_split", "prompt")
PROMPT_FIELDS = ("text", "entry_point", "example")


def _check_prompt(prompt: str) -> None:
    """A prompt names {text}, {entry_point}, {example} only: no attribute or item access, no format spec."""
    try:
        fields = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(prompt) if f is not None]
    except ValueError as e:
        raise ConfigError(f"data.task_args.prompt: not a valid format string ({e}): {prompt!r:.80}") from None
    for f, spec, conv in fields:
        if f not in PROMPT_FIELDS or spec or conv:
            shown = "{" + f + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "") + "}"
            what = f"unknown field {f[:60]!r}" if f not in PROMPT_FIELDS else f"{shown[:60]!r} is not allowed"
            raise ConfigError(f"data.task_args.prompt: {what}; it may use {{text}}, {{entry_point}} and {{example}}, "
                              "as they are (no attributes, indexes, conversions or format specs)")


def check_args(args: dict) -> None:
    """Raise ConfigError naming `data.task_args.<name>` and what it allows, for any task arg the code task does
    not take or cannot use; None when all are fine. `build` calls it first; config resolution can call it on
    `data.task_args` (before any data is read) so that a bad value never reaches the sandbox, where every
    sample would crash and score 0.

    >>> check_args({"memory_mb": 512, "wall_s": 3})
    >>> check_args({"wall_s": -1})
    Traceback (most recent call last):
    ...
    tinyrl.errors.ConfigError: data.task_args.wall_s: must be a number from 0.1 to 3600.0 (seconds), got -1
    """
    if not isinstance(args, dict):
        raise ConfigError(f"data.task_args: must be a mapping of the code task's arguments, got {args!r:.60}")
    unknown = sorted(str(k) for k in args if k not in TASK_ARGS)
    if unknown:
        raise ConfigError(f"data.task_args: the code task does not take {unknown}; it takes {list(TASK_ARGS)}")
    for name, choices in (("template", ("default", "plain")), ("reward", REWARDS)):
        if name in args and (not isinstance(args[name], str) or args[name] not in choices):
            raise ConfigError(f"data.task_args.{name}: must be one of {list(choices)}, got {args[name]!r:.60}")
    f = args.get("eval_fraction", 0.1)
    if type(f) not in (int, float) or not 0 <= f < 1:
        raise ConfigError(f"data.task_args.eval_fraction: must be in [0, 1), got {f!r:.60}")
    for name in [n for n in _OPTIONAL_STRINGS + ("split",) if n in args]:
        v = args[name]
        if (v is not None or name == "split") and not (isinstance(v, str) and v.strip()):
            raise ConfigError(f"data.task_args.{name}: must be a non-empty string{'' if name == 'split' else ' or null'}, "
                              f"got {v!r:.60}")
    if "weak_isolation" in args and not isinstance(args["weak_isolation"], bool):
        raise ConfigError(f"data.task_args.weak_isolation: must be true or false, got {args['weak_isolation']!r:.60}")
    if args.get("path") and args.get("dataset"):
        raise ConfigError("data.task_args: give `path` (local files) or `dataset` (a hub id), not both")
    if args.get("prompt") is not None:
        _check_prompt(args["prompt"])
    check_limits({k: args[k] for k in ("cpu_s", "wall_s", "memory_mb") if k in args}, "data.task_args")


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
