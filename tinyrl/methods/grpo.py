"""GRPO and the family its switches make (Dr. GRPO, DAPO, GSPO, RLOO, REINFORCE++): the trainer
(tinyrl/trainer.py) set up from a run config, continued from the run folder's newest checkpoint."""

from __future__ import annotations

import logging

from tinyrl import checkpoint, distributed
from tinyrl.checkpoint import ResumeError
from tinyrl.methods.common import Summary, build_run, error_text, note_resume, read_summary, write_summary
from tinyrl.runs import Run, RunDir, truncate_jsonl
from tinyrl.trainer import Trainer

log = logging.getLogger("tinyrl")
STEP_LOGS = ("metrics.jsonl", "samples.jsonl", "alarms.jsonl")


def build(cfg, run: RunDir, resume: bool = False) -> Trainer:
    """A trainer for `run`, from its newest checkpoint when it has one (`resume`: it must have one)."""
    if resume and not run.checkpoints():
        raise ResumeError(f"--resume {run.path}: no checkpoint in {run.ckpt_dir} to continue from "
                          f"(set train.save_every to checkpoint during a run)")
    dist = distributed.setup(cfg.dist.timeout_s)  # [dist] one process, or this rank of the launch
    parts = build_run(cfg, dist)
    trainer = Trainer(cfg, run, parts, dist)
    if run.checkpoints():
        data = checkpoint.newest(run)
        trainer.restore(data)
        log.info("continuing %s from %s (step %d)", run.path, data.path.name, trainer.state.step)
        if resume:
            note_resume(run, step=trainer.state.step, checkpoint=data.path.name)
    elif carried := (prior := read_summary(run)).get("details", {}).get("eval_before_from"):  # tinyrl.methods.chain
        trainer.state.eval_before, trainer.state.eval_before_from = prior["eval_before"], carried
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
                    **({"eval_before_from": st.eval_before_from} if st.eval_before_from else {}),
                    **({"eval_sampled": st.eval_sampled} if st.eval_sampled else {}),  # pass@k, maj@k
                    **({"data_filter": f} if (f := getattr(trainer.prompts.rows, "filtered", None)) else {})})


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
