"""Supervised fine-tuning (LoRA / QLoRA) through TRL's `SFTTrainer`: `tinyrl sft` and the `sft` stage.

    tinyrl sft tiny_sft_cpu                      # the task's true answers for its train prompts
    tinyrl sft tiny_sft_cpu data=rows.jsonl      # prompt/completion rows
    tinyrl sft tiny_sft_cpu data=runs/some-run sft.min_reward=1.0   # a run folder's correct samples
    sft: {data: demonstrations}   # an agent task's expert trajectories (tinyrl.agents.demonstrations)

Where rows come from and how they are tokenized: tinyrl/methods/sft_data.py; TRL's side:
tinyrl/methods/sft_trl.py. The run folder is tinyrl's: config.yaml, metrics.jsonl (a row per
logging step, `step` = optimiser step), checkpoints/checkpoint-N (TRL's own), adapter/,
summary.json (the common schema; `details.rows`, `details.train_loss`).
"""

from __future__ import annotations

import logging

from tinyrl import distributed
from tinyrl.errors import ConfigError
from tinyrl.methods.common import HeldOut, Summary, error_text, load_model, read_summary, write_summary
from tinyrl.methods.sft_data import sft_rows
from tinyrl.methods.sft_trl import fit, require_trl
from tinyrl.runs import Run, RunDir

log = logging.getLogger("tinyrl.sft")


def run(cfg, run_dir: RunDir, resume: bool = False) -> Run:
    """SFT in `run_dir`, continuing its newest TRL checkpoint; held-out pass@1 before and after."""
    require_trl()
    rows = sft_rows(cfg)
    if not rows:
        raise ConfigError(f"sft.data: no rows to train on from {cfg.sft.data or 'the task'}"
                          + (f" with reward >= {cfg.sft.min_reward}" if cfg.sft.min_reward is not None else ""))
    prior = read_summary(run_dir)  # a resumed run keeps the figure it measured first (or a stage chain carried)
    before, carried = prior.get("eval_before"), prior.get("details", {}).get("eval_before_from")
    model, tok = load_model(cfg, distributed.setup(cfg.dist.timeout_s))
    held_out = HeldOut(cfg, tok)
    if before is None:
        before = held_out(model)
        log.info("sft: %d rows; held-out accuracy before: %s", len(rows), before)
    summary = Summary("sft", eval_before=before,
                      details={"rows": len(rows), **({"eval_before_from": carried} if carried else {})})
    write_summary(run_dir, summary)
    res = None
    try:
        res = fit(cfg, model, tok, rows, run_dir.path)
        summary.steps, summary.interrupted = res.steps, res.interrupted
        summary.details["train_loss"] = res.train_loss
        if not res.interrupted:
            summary.eval_after = held_out(model)
            log.info("sft: held-out accuracy after: %s", summary.eval_after)
    except BaseException as e:
        summary.error = error_text(e)
        raise
    finally:
        write_summary(run_dir, summary)
    return Run(run_dir.path, run_dir.metrics(), summary.eval_before, summary.eval_after,
               None if res.interrupted else res.adapter, interrupted=res.interrupted)
