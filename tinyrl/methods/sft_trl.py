"""SFT through TRL's `SFTTrainer`: its config from tinyrl's sections, callbacks that write
metrics.jsonl and stop on a signal, and `fit`, the one SFT routine (`tinyrl sft`, the sft stage and
ReST-EM's M-step). TRL trains: its optimiser, schedule, checkpoints (checkpoints/checkpoint-N) and
resume (`resume_from_checkpoint`), with `completion_only_loss` building labels that are -100 on
every prompt token. TRL is the `sft` extra, imported when SFT runs.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import warnings
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PrinterCallback, ProgressCallback, TrainerCallback

from tinyrl.errors import ConfigError
from tinyrl.methods.sft_data import agent_for, tokenize
from tinyrl.model import checkpointing_on
from tinyrl.runs import truncate_jsonl
from tinyrl.stop import StopSignals
from tinyrl.trackers.fanout import open_trackers

log = logging.getLogger("tinyrl.sft")

CKPT_PREFIX = "checkpoint-"  # TRL / transformers checkpoint folders


def require_trl():
    try:
        import trl  # noqa: F401
    except ImportError as e:
        raise ConfigError("stages: SFT (the sft, rest_em and star stages) runs on TRL, which is not installed: "
                          "pip install 'tinyrl-rlvr[sft]'") from e



def trl_args(cfg, output_dir: Path, num_rows: int):
    """TRL's SFTConfig from tinyrl's sections: `sft` (its own switches) and `train`/`model`/`log`."""
    from trl import SFTConfig as TRLSFTConfig  # the sft extra: imported when SFT runs

    s = cfg.sft
    steps_per_epoch = math.ceil(num_rows / (s.batch_size * s.grad_accum))
    with warnings.catch_warnings():  # transformers 5 renames it activation_checkpointing; TRL reads this name
        warnings.filterwarnings("ignore", "`gradient_checkpointing` is deprecated", FutureWarning)
        return _trl_config(TRLSFTConfig, cfg, s, output_dir, steps_per_epoch, torch.cuda.is_available())


def _trl_config(TRLSFTConfig, cfg, s, output_dir, steps_per_epoch, cuda):
    return TRLSFTConfig(
        output_dir=str(output_dir),
        num_train_epochs=s.epochs,
        max_steps=s.max_steps if s.max_steps is not None else -1,
        learning_rate=s.lr,
        lr_scheduler_type=s.scheduler,
        warmup_steps=round(s.warmup_ratio * (s.max_steps or steps_per_epoch * s.epochs)),
        per_device_train_batch_size=s.batch_size,
        gradient_accumulation_steps=s.grad_accum,
        max_length=s.max_length,
        completion_only_loss=s.completion_only_loss,
        weight_decay=cfg.train.weight_decay,
        max_grad_norm=cfg.train.max_grad_norm,
        seed=cfg.train.seed,
        logging_steps=s.logging_steps,
        save_strategy="steps" if s.save_every else "no",
        save_steps=s.save_every or 500,
        save_total_limit=cfg.train.keep_last,
        gradient_checkpointing=checkpointing_on(cfg.model),
        bf16=cfg.model.dtype == "bfloat16",
        fp16=cfg.model.dtype == "float16",
        use_cpu=not cuda,
        disable_tqdm=not cfg.log.progress,
        report_to="none",
        dataloader_num_workers=0,
    )


class MetricsCallback:
    """Writes TRL's training logs to metrics.jsonl: one row per logging step, `step` = optimiser step,
    and hands each row to the run's trackers (log.report_to; tinyrl.trackers), as the GRPO trainer does.

    TRL's `learning_rate` is written as `lr` (the GRPO trainer's name for it); the last log
    (train_runtime, train_loss) is kept in `final` for summary.json, not written as a row."""

    def __init__(self, path: Path, trackers=None):
        self.path = path
        self.trackers = trackers
        self.final: dict = {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = dict(logs or {})
        if "train_runtime" in logs:
            self.final = logs
            return
        if "loss" not in logs:
            return
        if "learning_rate" in logs:
            logs["lr"] = logs.pop("learning_rate")
        row = {"step": state.global_step, **{k: v for k, v in logs.items() if _finite(v)}}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self.trackers:
            self.trackers.log_step(row["step"], row, [], [])


def _finite(v) -> bool:
    return not isinstance(v, float) or math.isfinite(v)


class StopAtStep:
    """TRL callback: once a stop was requested (tinyrl.stop.StopSignals), end the run at this optimiser
    step with a checkpoint (TRL saves it)."""

    def __init__(self, stop: StopSignals):
        self.stop = stop

    def on_step_end(self, args, state, control, **kwargs):
        if self.stop.requested:
            control.should_save = True
            control.should_training_stop = True
        return control


class Progress:
    """A tqdm bar over optimiser steps with the loss (like the GRPO trainer's), no log dicts printed."""

    bar = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.bar = tqdm(total=state.max_steps, initial=state.global_step, desc="sft", unit="step", dynamic_ncols=True)

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.bar is not None and logs and "loss" in logs:
            self.bar.set_postfix(loss=f"{logs['loss']:.4g}")

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()


def _as_callbacks(*objs):
    """Plain objects with `on_*` methods as transformers TrainerCallbacks."""
    out = []
    for obj in objs:
        cb = type(f"{type(obj).__name__}Callback", (TrainerCallback,), {})()
        for name in ("on_train_begin", "on_log", "on_step_end", "on_train_end"):
            if hasattr(obj, name):
                setattr(cb, name, getattr(obj, name))
        out.append(cb)
    return out


def make_trainer(cfg, model, tokenizer, dataset, output_dir: Path, callbacks=()):
    """TRL's SFTTrainer over a tokenized dataset (see `tokenize`), checkpointing into `output_dir`."""
    require_trl()
    import datasets  # the sft extra: imported when SFT runs
    from trl import SFTTrainer

    datasets.disable_progress_bars()  # TRL's dataset preparation bars; tinyrl draws its own progress
    args = trl_args(cfg, output_dir, len(dataset))
    progress = [Progress()] if cfg.log.progress else []
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                         callbacks=_as_callbacks(*callbacks, *progress))
    for cb in (PrinterCallback, ProgressCallback):  # they print every log dict
        trainer.remove_callback(cb)
    return trainer


def last_checkpoint(folder: Path) -> Path | None:
    """The newest complete TRL checkpoint in `folder` (one whose trainer_state.json was written last)."""
    if not folder.is_dir():
        return None
    done = [p for p in folder.iterdir() if p.name.startswith(CKPT_PREFIX) and (p / "trainer_state.json").is_file()
            and p.name[len(CKPT_PREFIX):].isdigit()]
    return max(done, key=lambda p: int(p.name[len(CKPT_PREFIX):]), default=None)


def save_adapter(model, dest: Path) -> Path:
    """Save the peft adapter into `dest` atomically (a tmp folder renamed into place)."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest


@dataclass
class FitResult:
    adapter: Path | None  # None when interrupted (a checkpoint holds the progress)
    steps: int
    train_loss: float | None
    interrupted: bool


def fit(cfg, model, tokenizer, rows: list[dict], folder: Path) -> FitResult:
    """SFT `model` on `rows` in `folder` (metrics.jsonl, checkpoints/, adapter/); resumes from the
    newest checkpoint there. The one SFT routine: `tinyrl sft`, the sft stage and ReST-EM's M-step."""
    folder.mkdir(parents=True, exist_ok=True)
    ckpt_dir = folder / "checkpoints"
    resume = last_checkpoint(ckpt_dir)
    truncate_jsonl(folder / "metrics.jsonl", _ckpt_step(resume))  # drop rows past the checkpoint
    trackers = open_trackers(cfg, folder, is_main=True, start_step=_ckpt_step(resume))  # log.report_to
    metrics = MetricsCallback(folder / "metrics.jsonl", trackers)
    with closing(trackers), StopSignals(defer=lambda: True, what="this optimiser step") as stop:
        dataset = tokenize(rows, tokenizer, cfg.data, agent_for(cfg, tokenizer), cfg.rollout.max_new_tokens)
        trainer = make_trainer(cfg, model, tokenizer, dataset, ckpt_dir, [metrics, StopAtStep(stop)])
        if resume is not None:
            log.info("sft: resuming from %s", resume)
        trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    steps = trainer.state.global_step
    if stop.requested:
        return FitResult(None, steps, None, True)
    return FitResult(save_adapter(model, folder / "adapter"), steps, metrics.final.get("train_loss"), False)


def _ckpt_step(ckpt: Path | None) -> int:
    return int(ckpt.name[len(CKPT_PREFIX):]) if ckpt is not None else 0
