"""The Python API: `tinyrl.train(...)` and `tinyrl.evaluate(...)`. The CLI, the UI and the notebooks
call these; each resolves the run once (tinyrl.config.resolve) and hands it to tinyrl.methods."""

from __future__ import annotations

import logging

from tinyrl.config import resolve
from tinyrl.data import load_rows
from tinyrl.errors import ConfigError
from tinyrl.evaluation import EvalReport, evaluate_rows
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


def evaluate(preset=None, adapter=None, report: bool = False, **overrides) -> float | EvalReport:
    """Held-out greedy pass@1 of the preset's model; `adapter` is a run folder or adapter folder.

    With `report=True`, the whole `tinyrl.evaluation.EvalReport`: the task's own scores (EM, F1)
    and, for agent presets, tool calls / turns / tool error rate per question. The rollout is the
    HF engine (one card or a CPU), multi-turn when the preset's `agent.enabled`."""
    cfg = resolve(preset, overrides=overrides, decide_auto=False).cfg  # nothing trains: no `auto` to decide
    model, tok = load_policy(cfg.model, cfg.lora, adapter=str(adapter) if adapter else None)
    _, rows, task = load_rows(cfg.data)
    if task is None:
        raise ConfigError("data.task: evaluate needs a built-in task with a verifier (data.task)")
    engine = make_engine("hf", model, tok, cfg, seed=cfg.train.seed, task=task)
    render_rows(rows, prompt_renderer(cfg, tok, task, engine))  # as the engine sees them (an agent's tools too)
    result = evaluate_rows(engine, rows, task, sampling_params(cfg, task))
    return result if report else result.accuracy
