"""The Python API: `tinyrl.train(...)`, `tinyrl.evaluate(...)` and `tinyrl.export(...)`. The CLI, the UI
and the notebooks call these; each resolves the run once (tinyrl.config.resolve) and hands it to tinyrl.methods."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from tinyrl import hub_push
from tinyrl.config import resolve
from tinyrl.data import load_rows
from tinyrl.errors import ConfigError
from tinyrl.evaluation import EvalReport, check_k, evaluate_rows, evaluate_sampled, run_folder_of, write_eval
from tinyrl.exporter import check_dtype, check_out, export_merged, run_adapter
from tinyrl.methods import grpo
from tinyrl.methods.common import open_run, render_rows, sampling_params
from tinyrl.methods.runner import run_method
from tinyrl.model import load_policy
from tinyrl.rollout.engines import make_engine, prompt_renderer
from tinyrl.runs import Run
from tinyrl.trainer import Trainer

log = logging.getLogger("tinyrl")


def train(preset=None, profile=None, resume=None, **overrides) -> Run:
    """Train a preset (or continue `resume`, a run folder); returns the finished `Run`.

    Overrides are dotted `section.field` keys (`**{"train.steps": 20}`) or sections
    (`train={"steps": 20}`). A config with `stages` (sft, grpo, rest_em, star) runs them in order."""
    return run_method(resolve(preset, profile, overrides, resume))


def build_trainer(preset=None, profile=None, resume=None, overrides: dict | None = None) -> Trainer:
    """A ready GRPO Trainer in a fresh run folder, or an existing one continued from its last checkpoint
    (for driving the loop step by step). The folder stays locked until `trainer.run.unlock()` (or the
    process ends); a fresh folder is removed again when the trainer cannot be built."""
    resolved = resolve(preset, profile, overrides, resume)
    folder = open_run(resolved)
    try:
        return grpo.build(resolved.cfg, folder, resume=resolved.resume is not None)
    except BaseException:
        if resolved.resume is None:
            folder.discard()
        folder.unlock()
        raise


def evaluate(preset=None, adapter=None, report: bool = False, samples: int = 0, k: list[int] | None = None,
             temperature: float | None = None, **overrides) -> float | EvalReport:
    """Held-out greedy pass@1 of the preset's model; `adapter` is a run folder or adapter folder.

    With `report=True`, the whole `tinyrl.evaluation.EvalReport`: the task's own scores (EM, F1)
    and, for agent presets, tool calls / turns / tool error rate per question. The rollout is the
    HF engine (one card or a CPU), multi-turn when the preset's `agent.enabled`.

    `samples=N` (> 0) also draws N completions of each prompt at `temperature` (default:
    rollout.temperature) and reports pass@k and maj@k for each of `k` (default 1, 2, 4, ... up to
    N; tinyrl.passk): the report is returned whatever `report` says, and written as eval-<time>.json
    into the adapter's run folder when there is an adapter."""
    if samples:
        check_k(samples, k, "samples")  # before the model loads
    elif k or temperature is not None:
        raise ConfigError("samples: k and temperature are for sampled evaluation (pass@k / maj@k); "
                          "give samples=N (N >= the largest k) completions per prompt")
    cfg = resolve(preset, overrides=overrides, decide_auto=False).cfg  # nothing trains: no `auto` to decide
    model, tok = load_policy(cfg.model, cfg.lora, adapter=str(adapter) if adapter else None)
    _, rows, task = load_rows(cfg.data)
    if task is None:
        raise ConfigError("data.task: evaluate needs a built-in task with a verifier (data.task)")
    engine = make_engine("hf", model, tok, cfg, seed=cfg.train.seed, task=task)
    render_rows(rows, prompt_renderer(cfg, tok, task, engine))  # as the engine sees them (an agent's tools too)
    params = sampling_params(cfg, task)
    result = evaluate_rows(engine, rows, task, params)
    if not samples:
        return result if report else result.accuracy
    result.sampled = evaluate_sampled(engine, rows, task, params, samples, k, temperature, where="samples")
    if adapter:
        result.path = write_eval(result, run_folder_of(adapter))
    return result


@dataclass
class Exported:
    """What `export` did: the merged model's folder (None: not asked for) and the hub repo's URL."""

    merged: Path | None = None
    url: str | None = None


def export(run_dir, merged=None, push: str | None = None, private: bool = False, dtype: str = "bfloat16",
           token: str | None = None) -> Exported:
    """Export a finished run: `merged` (a new folder) gets its base model with the adapter merged in
    (16-bit; a QLoRA run's base reloaded unquantized, never merged into nf4); `push` (USER/NAME) uploads
    the merged model when `merged` is given, else the adapter, with a model card. Every argument and the
    hub login are checked before the (slow) merge."""
    if merged is None and push is None:
        raise ConfigError("export: give merged=OUT (a folder for the merged model) and/or push=USER/NAME")
    check_dtype(dtype)
    adapter = run_adapter(run_dir)
    if merged is not None:
        check_out(merged)
    if push is not None:
        hub_push.check_repo_id(push)
        token = hub_push.login_token(token)
    out = export_merged(run_dir, merged, dtype) if merged is not None else None
    url = None
    if push is not None:
        url = hub_push.push(run_dir, push, out or adapter, kind="merged" if out else "adapter", private=private,
                            token=token, dtype=dtype if out else None)
    return Exported(out, url)
