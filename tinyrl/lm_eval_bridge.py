"""`tinyrl eval RUN --lm-eval TASKS`: a trained run scored by lm-evaluation-harness (`pip install 'tinyrl-rlvr[lm-eval]'`).

    tinyrl eval runs/NAME --lm-eval gsm8k,arc_easy --lm-eval-fewshot 5 --lm-eval-limit 200
    tinyrl eval runs/NAME --lm-eval my_task --lm-eval-include ./my_tasks     # a task YAML of your own

The model is the run's base with its adapter on top (peft's PeftModel, loaded as the run trained it: its dtype, its
4-bit base), handed to the harness's own `HFLM` and `lm_eval.simple_evaluate`: any harness task, group or tag by
name, each with its own prompts, metrics, filters and few-shot settings (`--lm-eval-fewshot` overrides the number of
shots, `--lm-eval-limit` takes the first N documents of each task). Task names are checked against the harness's
task index (with `--lm-eval-include`'s folder of task YAMLs) before the model loads.

What it writes into the run folder, beside `tinyrl eval`'s eval-*.json: `lm_eval-<time>.json` (the results, the
shots, the sample counts, the tasks' configs and versions), `lm_eval-<time>-samples.jsonl` (each document, its
target, the filtered response and its metrics), and summary.json's `details.lm_eval` ({task: {metric: value}},
which the model card's results table reads: tinyrl.hub_push). The run's trackers (log.report_to) get the scores as
`lm_eval/<task>/<metric>` at the run's last step.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import json
import logging
import math
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from tinyrl.errors import ConfigError, MissingExtra
from tinyrl.runs import RunDir, RunLockedError, atomic_write_text, finite_json

log = logging.getLogger("tinyrl")
MAX_TASKS, MAX_FEWSHOT, MAX_LIMIT, MAX_BATCH = 64, 100, 1_000_000, 1024
_TASK = re.compile(r"^[A-Za-z0-9][\w.\-:|]{0,199}$")  # the harness's task, group and tag names
MISSING = "--lm-eval needs lm-evaluation-harness: pip install 'tinyrl-rlvr[lm-eval]'"


def require_lm_eval():
    """The `lm_eval` module, or a MissingExtra naming the extra to install."""
    try:
        return importlib.import_module("lm_eval")
    except ImportError as e:
        raise MissingExtra(MISSING) from e


def parse_tasks(tasks) -> list[str]:
    """The task names of `--lm-eval` ("gsm8k,arc_easy", or a list), in order, once each; ConfigError otherwise.

    >>> parse_tasks("gsm8k, arc_easy,gsm8k"), parse_tasks(["mmlu"])
    (['gsm8k', 'arc_easy'], ['mmlu'])
    """
    items = tasks.split(",") if isinstance(tasks, str) else tasks
    if not isinstance(items, (list, tuple)) or not all(isinstance(t, str) for t in items):
        raise ConfigError(f"--lm-eval: task names, comma-separated (gsm8k,arc_easy), got {tasks!r:.80}")
    names = list(dict.fromkeys(t.strip() for t in items if t.strip()))
    if not names:
        raise ConfigError("--lm-eval: name at least one harness task (gsm8k, arc_easy, mmlu, ...)")
    if len(names) > MAX_TASKS:
        raise ConfigError(f"--lm-eval: at most {MAX_TASKS} tasks at once, got {len(names)}")
    bad = next((n for n in names if not _TASK.match(n)), None)
    if bad is not None:
        raise ConfigError(f"--lm-eval: {bad!r:.80} is not a task name (letters, digits, '_', '-', '.', ':', '|'; "
                          f"at most 200 characters)")
    return names


def check_number(value, flag: str, lo: int, hi: int) -> int | None:
    """`value` as a whole number in [lo, hi] (None stays None: the harness's default); ConfigError naming `flag`."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{flag}: a whole number, got {value!r:.40}")
    if not lo <= value <= hi:
        raise ConfigError(f"{flag}: must be in [{lo}, {hi}], got {value}")
    return value


def check_include(include) -> str | None:
    """`--lm-eval-include`: an existing folder of task YAMLs (or one YAML file), as a string."""
    if include is None:
        return None
    if not isinstance(include, (str, Path)) or not str(include).strip() or "\x00" in str(include):
        raise ConfigError(f"--lm-eval-include: a folder of harness task YAMLs, got {include!r:.80}")
    p = Path(include).expanduser()
    if not (p.is_dir() or (p.is_file() and p.suffix in (".yaml", ".yml"))):
        raise ConfigError(f"--lm-eval-include: {include}: not a folder of task YAMLs (or a .yaml file)")
    return str(p.resolve())


@functools.lru_cache(maxsize=4)
def task_manager(include: str | None, defaults: bool = True):
    """The harness's task index (its own tasks unless `defaults` is False, and `include`'s); built once (slow)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include, include_defaults=defaults)


def check_known(manager, names: list[str]) -> None:
    """ConfigError naming the first task the harness does not know, the closest names it does, and its list."""
    known = manager.all_tasks
    known_set = set(known)
    for name in names:
        if name not in known_set:
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
            raise ConfigError(f"--lm-eval: the harness has no task, group or tag {name!r}"
                              + (f" (did you mean {', '.join(close)}?)" if close else "")
                              + f"; it knows {len(known)} (`lm-eval ls tasks` lists them; a task of your own is a "
                                f"YAML in a folder given with --lm-eval-include)")


@dataclass
class LmEvalReport:
    """What `evaluate_run` measured and wrote."""

    results: dict  # {task: {metric: value}} (the metric keys as the harness names them: "acc,none")
    n_shot: dict = field(default_factory=dict)
    n_samples: dict = field(default_factory=dict)
    path: Path | None = None  # lm_eval-<time>.json
    samples_path: Path | None = None  # lm_eval-<time>-samples.jsonl

    def lines(self) -> list[str]:
        out = ["lm-evaluation-harness"]
        for task, got in self.results.items():
            shots = self.n_shot.get(task)
            n = (self.n_samples.get(task) or {}).get("effective")
            out.append(f"  {task}" + (f" ({shots}-shot" if shots is not None else " (")
                       + (f", {n} documents)" if n is not None else ")"))
            for key, value in got.items():
                metric = key.partition(",")[0]
                if metric.endswith("_stderr") or not isinstance(value, (int, float)) or isinstance(value, bool):
                    continue
                err = got.get(key.replace(metric, f"{metric}_stderr", 1))
                pm = f" ± {err:.4f}" if isinstance(err, (int, float)) and math.isfinite(err) else ""
                out.append(f"    {key}: {value:.4f}{pm}")
        return out


def scores_of(results: dict) -> dict:
    """The harness's `results` as {task: {metric: value}}: its numbers (and a task's alias), nothing else."""
    out = {}
    for task, got in (results or {}).items():
        keep = {}
        for k, v in (got or {}).items():
            if k == "alias" and isinstance(v, str):
                keep[k] = v
            elif k not in ("name", "sample_len") and isinstance(v, (int, float)) and not isinstance(v, bool):
                keep[k] = float(v)
            elif isinstance(v, str) and k.partition(",")[0].endswith("_stderr"):
                keep[k] = v  # "N/A"
        out[str(task)] = keep
    return out


def evaluate_run(run_dir, tasks, num_fewshot: int | None = None, limit: int | None = None, include=None,
                 batch_size: int = 1, include_defaults: bool = True) -> LmEvalReport:
    """Score run `run_dir`'s final adapter on harness `tasks` (see the module docstring); every argument and the
    task names are checked before the model loads. `include_defaults=False` indexes `include`'s tasks only."""
    from tinyrl.exporter import run_adapter

    names = parse_tasks(tasks)
    fewshot = check_number(num_fewshot, "--lm-eval-fewshot", 0, MAX_FEWSHOT)
    limit = check_number(limit, "--lm-eval-limit", 1, MAX_LIMIT)
    batch_size = check_number(batch_size, "--lm-eval-batch-size", 1, MAX_BATCH)
    include = check_include(include)
    if not isinstance(run_dir, (str, Path)):
        raise ConfigError(f"--lm-eval: RUN is a run folder, got {run_dir!r:.60}")
    adapter = run_adapter(run_dir)  # a run folder with its final adapter
    lm_eval = require_lm_eval()
    manager = task_manager(include, include_defaults)
    check_known(manager, names)
    got, cfg = _run_harness(lm_eval, Path(run_dir), adapter, names, fewshot, limit, batch_size, manager)
    scores = scores_of(got.get("results"))
    report = LmEvalReport(scores, dict(got.get("n-shot") or {}), dict(got.get("n-samples") or {}))
    report.path, report.samples_path = write_results(Path(run_dir), got, scores, {
        "tasks": names, "num_fewshot": fewshot, "limit": limit, "batch_size": batch_size, "include": include,
        "adapter": str(adapter), "base_model": cfg.model.name})
    record_in_summary(Path(run_dir), scores)
    _to_trackers(cfg, Path(run_dir), scores)
    return report


def _run_harness(lm_eval, run: Path, adapter: Path, names, fewshot, limit, batch_size, manager):
    from lm_eval.models.huggingface import HFLM

    from tinyrl import distributed
    from tinyrl.config import resolve
    from tinyrl.methods.common import load_model

    cfg = resolve(resume=str(run), decide_auto=False).cfg  # the run's own config.yaml: its base, dtype, 4-bit
    model, tokenizer = load_model(cfg, distributed.setup(cfg.dist.timeout_s), adapter=str(adapter))
    model.eval()
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
    log.info("lm-eval: %s on %s with the adapter of %s", ", ".join(names), cfg.model.name, run)
    try:
        got = lm_eval.simple_evaluate(model=lm, tasks=names, num_fewshot=fewshot, limit=limit, task_manager=manager,
                                      log_samples=True, random_seed=cfg.train.seed)
    except (FileNotFoundError, ConnectionError) as e:  # a task's data is not here and the hub cannot be reached
        raise ConfigError(f"--lm-eval {','.join(names)}: cannot load a task's data ({type(e).__name__}: {e}); "
                          f"download it once with network access, or give a local task (--lm-eval-include)") from None
    if not got:
        raise ConfigError(f"--lm-eval {','.join(names)}: the harness returned no results")
    return got, cfg


def _stamp(run: Path) -> str:
    stamp, i = time.strftime("%Y%m%d-%H%M%S"), 1
    base = stamp
    while (run / f"lm_eval-{stamp}.json").exists():
        stamp, i = f"{base}-{i}", i + 1
    return stamp


def _jsonable(x):
    from lm_eval.utils import handle_non_serializable

    return json.loads(json.dumps(x, default=handle_non_serializable))


def write_results(run: Path, got: dict, scores: dict, settings: dict) -> tuple[Path, Path]:
    """lm_eval-<time>.json (results, shots, counts, configs, versions) and lm_eval-<time>-samples.jsonl."""
    stamp = _stamp(run)
    path, samples_path = run / f"lm_eval-{stamp}.json", run / f"lm_eval-{stamp}-samples.jsonl"
    whole = {"settings": settings, "results": scores, "n-shot": got.get("n-shot"), "n-samples": got.get("n-samples"),
             "higher_is_better": got.get("higher_is_better"), "versions": got.get("versions"),
             "configs": got.get("configs"), "lm_eval_version": got.get("lm_eval_version"), "date": got.get("date")}
    lines = []
    for task, samples in (got.get("samples") or {}).items():
        for s in samples:
            row = {"task": task, **{k: s.get(k) for k in ("doc_id", "doc", "target", "arguments", "filtered_resps",
                                                             "filter")}}
            row.update({m: s.get(m) for m in s.get("metrics") or []})
            lines.append(json.dumps(finite_json(_jsonable(row))))
    atomic_write_text(samples_path, "".join(line + "\n" for line in lines))
    atomic_write_text(path, json.dumps(finite_json(_jsonable(whole)), indent=2))
    return path, samples_path


def record_in_summary(run: Path, scores: dict) -> None:
    """summary.json's details.lm_eval updated task by task (the model card reads it), under the run folder's
    lock; a run folder in use (a training run continuing it) keeps its summary, with a warning."""
    folder = RunDir(run)
    try:
        folder.lock()
    except RunLockedError as e:
        log.warning("lm-eval: %s; summary.json not updated (the results are in the lm_eval-*.json file)", e)
        return
    try:
        path = run / "summary.json"
        summary = json.loads(path.read_text()) if path.is_file() else {}
        if not isinstance(summary, dict):
            summary = {}
        details = summary.setdefault("details", {})
        details["lm_eval"] = {**(details.get("lm_eval") or {}), **scores}
        atomic_write_text(path, json.dumps(finite_json(summary), indent=2))
    finally:
        folder.unlock()


def _to_trackers(cfg, run: Path, scores: dict) -> None:
    if not cfg.log.report_to:
        return
    from tinyrl.trackers.fanout import open_trackers

    summary = run / "summary.json"
    step = (json.loads(summary.read_text()).get("steps") if summary.is_file() else None) or cfg.train.steps
    trackers = open_trackers(cfg, run, True, step)
    try:
        trackers.benchmark_results(scores, step)
    finally:
        trackers.close()
