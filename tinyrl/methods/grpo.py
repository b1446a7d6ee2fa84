"""GRPO and the family its switches make (Dr. GRPO, DAPO, GSPO, RLOO, REINFORCE++): the trainer
(tinyrl/trainer.py) set up from a run config, continued from the run folder's newest checkpoint."""

from __future__ import annotations

import logging

import torch

from tinyrl import checkpoint, distributed
from tinyrl.checkpoint import ResumeError
from tinyrl.data import load_rows
from tinyrl.methods.common import (
    Summary,
    error_text,
    note_resume,
    render_rows,
    reward_set,
    sampling_params,
    write_summary,
)
from tinyrl.model import load_policy
from tinyrl.rollout.engines import make_engine, prompt_renderer
from tinyrl.runs import Run, RunDir, truncate_jsonl
from tinyrl.trainer import Trainer, TrainerParts

log = logging.getLogger("tinyrl")
STEP_LOGS = ("metrics.jsonl", "samples.jsonl", "alarms.jsonl")


def build(cfg, run: RunDir, resume: bool = False) -> Trainer:
    """A trainer for `run`, from its newest checkpoint when it has one (`resume`: it must have one)."""
    if resume and not run.checkpoints():
        raise ResumeError(f"--resume {run.path}: no checkpoint in {run.ckpt_dir} to continue from "
                          f"(set train.save_every to checkpoint during a run)")
    dist = distributed.setup(cfg.dist.timeout_s)  # [dist] one process, or this rank of the launch
    distributed.check_world(cfg.train.prompts_per_step, dist.world)  # [dist]
    torch.manual_seed(cfg.train.seed)  # the LoRA init
    model, tokenizer = load_policy(cfg.model, cfg.lora, adapter=cfg.model.adapter)
    if not getattr(model, "is_loaded_in_4bit", False):  # 4-bit weights are placed at load
        model.to(dist.device)
    dist.broadcast_params([p for p in model.parameters() if p.requires_grad])  # [dist] one adapter
    train_rows, eval_rows, task = load_rows(cfg.data)
    engine = make_engine(cfg.rollout.engine, model, tokenizer, cfg, seed=cfg.train.seed, task=task)
    render_rows(train_rows + eval_rows, prompt_renderer(cfg, tokenizer, task, engine))
    parts = TrainerParts(model, tokenizer, engine, task, train_rows, eval_rows, reward_set(cfg, task),
                         sampling_params(cfg, task))
    trainer = Trainer(cfg, run, parts, dist)
    if run.checkpoints():
        data = checkpoint.newest(run)
        trainer.restore(data)
        log.info("continuing %s from %s (step %d)", run.path, data.path.name, trainer.state.step)
        if resume:
            note_resume(run, step=trainer.state.step, checkpoint=data.path.name)
    if dist.is_main:
        for name in STEP_LOGS:
            truncate_jsonl(run.path / name, trainer.state.step)  # rows after the checkpoint (all, from scratch)
    return trainer


def summary(trainer: Trainer, result: Run | None, error: str | None) -> Summary:
    st = trainer.state
    if result and result.interrupted and not result.resumable:
        error = f"aborted inside step {st.step + 1} before any checkpoint: nothing to resume"
    return Summary("grpo", st.step, st.eval_before, result.eval_after if result else None,
                   bool(result and result.interrupted and result.resumable), error,
                   [a["name"] for a in trainer.monitor.fired],
                   dict(trainer.rewards.total_failures),
                   {"skipped_steps": st.skipped_steps, "no_signal_steps": st.no_signal_steps,
                    "config_patches": st.config_patches,
                    **({"eval_sampled": st.eval_sampled} if st.eval_sampled else {})})  # pass@k, maj@k


def run(cfg, run_dir: RunDir, resume: bool = False) -> Run:
    """Train GRPO in `run_dir` (continuing it). summary.json and report.txt are written even when training
    stops on an error (the stale-weights canary, a crash): the report is most useful exactly then."""
    trainer = build(cfg, run_dir, resume)
    result, error = None, None
    try:
        result = trainer.train()
        return result
    except BaseException as e:
        error = error_text(e)
        raise
    finally:
        write_summary(run_dir, summary(trainer, result, error))
