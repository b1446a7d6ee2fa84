"""The Python API: `tinyrl.train(...)`, `tinyrl.evaluate(...)` and `tinyrl.export(...)`. The CLI, the UI
and the notebooks call these; each resolves the run once (tinyrl.config.resolve) and hands it to tinyrl.methods."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

from tinyrl import distributed, gguf_export, hub_push, hub_sync
from tinyrl.config import resolve
from tinyrl.errors import ConfigError
from tinyrl.evaluation import EvalReport, check_k, evaluate_rows, evaluate_sampled, run_folder_of, write_eval
from tinyrl.exporter import check_dtype, check_out, export_merged, run_adapter
from tinyrl.lm_eval_bridge import LmEvalReport, evaluate_run
from tinyrl.methods import grpo
from tinyrl.methods.common import build_run
from tinyrl.methods.runner import in_folder, run_method
from tinyrl.runs import Run
from tinyrl.trainer import Trainer

log = logging.getLogger("tinyrl")


def train(preset=None, profile=None, resume=None, **overrides) -> Run:
    """Train a preset (or continue `resume`, a run folder); returns the finished `Run`.

    Overrides are dotted `section.field` keys (`**{"train.steps": 20}`) or sections
    (`train={"steps": 20}`). A config with `stages` (sft, grpo, rest_em, star) runs them in order.
    `resume="hub:USER/NAME[@REVISION]"` continues a checkpoint pushed with log.hub_strategy=checkpoint, downloaded
    into a new run folder (tinyrl.hub_sync)."""
    resume = hub_sync.resume_source(resume, overrides)
    return run_method(resolve(preset, profile, overrides, resume))


def build_trainer(preset=None, profile=None, resume=None, overrides: dict | None = None) -> Trainer:
    """A ready GRPO Trainer in a fresh run folder, or an existing one continued from its last checkpoint
    (for driving the loop step by step). The folder stays locked until `trainer.run.unlock()` (or the
    process ends); a fresh folder is removed again when the trainer cannot be built."""
    resolved = resolve(preset, profile, overrides, resume)
    return in_folder(resolved, lambda folder: grpo.build(resolved.cfg, folder, resume=resolved.resume is not None),
                     keep_lock=True)


def evaluate(preset=None, adapter=None, report: bool = False, samples: int = 0, k: list[int] | None = None,
             temperature: float | None = None, lm_eval=None, lm_eval_fewshot: int | None = None,
             lm_eval_limit: int | None = None, lm_eval_include=None, lm_eval_batch_size: int = 1,
             **overrides) -> float | EvalReport | LmEvalReport:
    """Held-out greedy pass@1 of the preset's model; `adapter` is a run folder or adapter folder.

    With `report=True`, the whole `tinyrl.evaluation.EvalReport`: the task's own scores (EM, F1)
    and, for agent presets, tool calls / turns / tool error rate per question. The rollout is the
    HF engine (one card or a CPU), multi-turn when the preset's `agent.enabled`.

    `samples=N` (> 0) also draws N completions of each prompt at `temperature` (default:
    rollout.temperature) and reports pass@k and maj@k for each of `k` (default 1, 2, 4, ... up to
    N; tinyrl.passk): the report is returned whatever `report` says, and written as eval-<time>.json
    into the adapter's run folder when there is an adapter.

    `lm_eval="gsm8k,arc_easy"` (with `adapter`, a finished run folder) scores the run through lm-evaluation-harness
    instead (tinyrl.lm_eval_bridge: `lm_eval_fewshot`, `lm_eval_limit`, `lm_eval_include` a folder of task YAMLs,
    `lm_eval_batch_size`) and returns its `LmEvalReport`, written into the run folder and its summary.json."""
    lm_args = (lm_eval_fewshot, lm_eval_limit, lm_eval_include)
    if lm_eval is not None or any(a is not None for a in lm_args) or lm_eval_batch_size != 1:
        if lm_eval is None:
            raise ConfigError("lm_eval: lm_eval_fewshot / lm_eval_limit / lm_eval_include / lm_eval_batch_size go with "
                              "lm_eval=TASKS (the harness's task names)")
        if preset is not None or overrides or samples or k or temperature is not None or report:
            raise ConfigError("lm_eval: scores a run folder's adapter with the harness alone; a preset, overrides, "
                              "samples, k, temperature and report are tinyrl's own evaluation: evaluate twice")
        if adapter is None:
            raise ConfigError("lm_eval: give adapter=RUN_DIR, the finished run folder to score")
        return evaluate_run(adapter, lm_eval, lm_eval_fewshot, lm_eval_limit, lm_eval_include, lm_eval_batch_size)
    if samples:
        check_k(samples, k, "samples")  # before the model loads
        if temperature is not None and (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
                                        or not 0 < temperature < math.inf):
            raise ConfigError(f"temperature: a number > 0, got {temperature!r:.40}")
    elif k or temperature is not None:
        raise ConfigError("samples: k and temperature are for sampled evaluation (pass@k / maj@k); "
                          "give samples=N (N >= the largest k) completions per prompt")
    cfg = resolve(preset, overrides=overrides, decide_auto=False).cfg  # nothing trains: no `auto` to decide
    parts = build_run(cfg, distributed.setup(cfg.dist.timeout_s), adapter=str(adapter) if adapter else None,
                      train=False, engine="hf")  # the held-out rows rendered as the engine sees them
    if parts.task is None:
        raise ConfigError("data.task: evaluate needs a built-in task with a verifier (data.task)")
    result = evaluate_rows(parts.engine, parts.eval_rows, parts.task, parts.sampling)
    if not samples:
        return result if report else result.accuracy
    result.sampled = evaluate_sampled(parts.engine, parts.eval_rows, parts.task, parts.sampling, samples, k,
                                      temperature, where="samples")
    if adapter:
        result.path = write_eval(result, run_folder_of(adapter))
    return result


@dataclass
class Exported:
    """What `export` did: the merged model's folder (None: not asked for) and the hub repo's URL."""

    merged: Path | None = None
    url: str | None = None
    gguf: Path | None = None  # the GGUF file (None: not asked for)


def export(run_dir, merged=None, push: str | None = None, private: bool = False, dtype: str = "bfloat16",
           token: str | None = None, gguf=None, gguf_type: str = "f16") -> Exported:
    """Export a finished run: `merged` (a new folder) gets its base model with the adapter merged in
    (16-bit; a QLoRA run's base reloaded unquantized, never merged into nf4); `push` (USER/NAME) uploads
    the merged model when `merged` is given, else the adapter, with a model card; `gguf` (a new OUT.gguf)
    gets the merged model as one GGUF file of `gguf_type` (tinyrl.gguf_export). Every argument and the
    hub login are checked before the (slow) merge."""
    for name, value in (("run_dir", run_dir), ("merged", merged), ("gguf", gguf), ("push", push), ("token", token)):
        if (value is not None or name == "run_dir") and not isinstance(value, (str, Path)):
            raise ConfigError(f"export: {name} must be a {'string' if name in ('push', 'token') else 'path'}, "
                              f"got {value!r:.60}")
    if merged is None and push is None and gguf is None:
        raise ConfigError("export: give merged=OUT (a folder for the merged model) and/or push=USER/NAME "
                          "and/or gguf=OUT.gguf")
    check_dtype(dtype)
    adapter = run_adapter(run_dir)
    if merged is not None:
        check_out(merged)
    if gguf is not None:
        gguf_export.check_gguf_type(gguf_type)
        gguf_export.check_gguf_out(gguf)
    if push is not None:
        hub_push.check_repo_id(push)
        token = hub_push.login_token(token)
    wanted = merged is not None or gguf is not None
    cfg = resolve(resume=run_dir, decide_auto=False).cfg if wanted else None  # its config.yaml, once
    if gguf is not None:
        gguf_export.check_base(cfg)  # an architecture GGUF cannot take: refused before any merge
    out = export_merged(run_dir, merged, cfg, dtype) if merged is not None else None
    gguf_file = gguf_export.export_gguf(run_dir, gguf, cfg, gguf_type) if gguf is not None else None
    url = None
    if push is not None:
        url = hub_push.push(run_dir, push, out or adapter, kind="merged" if out else "adapter", private=private,
                            token=token, dtype=dtype if out else None)
    return Exported(out, url, gguf_file)
