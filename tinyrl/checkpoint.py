"""Checkpoints of a run: everything needed to continue bit for bit.

A checkpoint holds the LoRA adapter (peft format, `adapter/`) and `trainer_state.pt`:
optimizer, LR scheduler, RNG states (python, numpy, torch), prompt-order position, step,
monitor state, the rollout engine's sampling seed position, and the run's config. RunDir
writes it atomically.

Loading reads and checks every file before it changes anything (`read`, then `apply`), so
a checkpoint that turns out corrupt leaves the trainer as it was, and `load_latest` goes
on to the next newest one, saying which it skipped and why (the skipped one is moved to
`checkpoints/.corrupt-step-...`, kept, not deleted).
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger("tinyrl.checkpoint")
STATE_FILE = "trainer_state.pt"
ADAPTER_FILE = "adapter/adapter_model.safetensors"
STATE_KEYS = ("step", "optimizer", "scheduler", "rng", "prompts", "engine", "monitor", "skipped_steps",
              "eval_before", "reward_failures")


class ResumeError(RuntimeError):
    pass


class CorruptCheckpoint(ResumeError):
    """A checkpoint whose files are missing, truncated or unreadable (the message names the file)."""


@dataclass
class CheckpointData:
    path: Path
    weights: dict  # adapter tensors
    state: dict  # trainer_state.pt


def make_scheduler(optimizer, train_cfg, iterations_per_step: int = 1):
    """LambdaLR: linear warmup, then constant | linear | cosine decay over all optimiser steps."""
    total = max(train_cfg.steps * iterations_per_step, 1)
    warm = train_cfg.warmup_steps * iterations_per_step
    decay = {
        "constant": lambda p: 1.0,
        "linear": lambda p: max(0.0, 1.0 - p),
        "cosine": lambda p: 0.5 * (1.0 + math.cos(math.pi * min(p, 1.0))),
    }[train_cfg.scheduler]

    def factor(i: int) -> float:
        if i < warm:
            return (i + 1) / warm
        return decay((i - warm) / max(total - warm, 1))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.random.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def _set_rng_state(s: dict) -> None:
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.random.set_rng_state(s["torch"])
    if s.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def _dist(trainer):
    from tinyrl.distributed import Dist

    return getattr(trainer, "dist", None) or Dist()


def save(trainer) -> Path:
    """Rank 0 writes the checkpoint (other ranks' run folder writes nothing), with every rank's RNG state."""
    rngs = _dist(trainer).all_gather_object(_rng_state())
    state = {
        "step": trainer.step,
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.scheduler.state_dict(),
        "rng": rngs[0],
        "rng_ranks": rngs,  # one per process of the run that wrote it
        "prompts": trainer.prompts.state_dict(),
        "engine": trainer.engine.state_dict(),
        "monitor": trainer.monitor.state_dict(),
        "skipped_steps": trainer.skipped_steps,
        "no_signal_steps": trainer.no_signal_steps,
        "eval_before": trainer.eval_before,
        "reward_failures": trainer.rewards.total_failures,
        "config": trainer.cfg.to_dict(),
    }

    def write(tmp: Path) -> None:
        trainer.model.save_pretrained(tmp / "adapter")
        torch.save(state, tmp / STATE_FILE)

    return trainer.run.save_checkpoint(trainer.step, write, trainer.cfg.train.keep_last)


def read(path: Path) -> CheckpointData:
    """Both files of a checkpoint, read and checked; CorruptCheckpoint naming the file otherwise."""
    from safetensors.torch import load_file

    path = Path(path)
    adapter_file, state_file = path / ADAPTER_FILE, path / STATE_FILE
    for f in (adapter_file, state_file):
        if not f.is_file():
            raise CorruptCheckpoint(f"{f} is missing")
    try:
        weights = load_file(str(adapter_file))
    except Exception as e:  # safetensors raises its own SafetensorError for a truncated file
        raise CorruptCheckpoint(f"{adapter_file} is truncated or corrupt ({type(e).__name__}: {e})") from e
    try:
        state = torch.load(state_file, weights_only=False)
    except Exception as e:  # EOFError, UnpicklingError, RuntimeError ("PytorchStreamReader failed ...")
        raise CorruptCheckpoint(f"{state_file} is truncated or corrupt ({type(e).__name__}: {e})") from e
    missing = [k for k in STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise CorruptCheckpoint(f"{state_file} lacks {missing}: not a tinyrl trainer state")
    return CheckpointData(path, weights, state)


def apply(trainer, data: CheckpointData) -> None:
    """Load a checkpoint that `read` accepted into the trainer (ResumeError if the adapter does not fit)."""
    from peft import set_peft_model_state_dict

    path, weights, state = data.path, data.weights, data.state
    expected = {k for k, p in trainer.model.named_parameters() if p.requires_grad}
    try:
        result = set_peft_model_state_dict(trainer.model, weights)
    except RuntimeError as e:
        raise ResumeError(f"the adapter in {path} does not fit model {trainer.cfg.model.name!r} "
                          f"(different base model or LoRA rank?): {e}") from e
    missing = [k for k in getattr(result, "missing_keys", []) if k in expected]
    if missing:
        raise ResumeError(f"the adapter in {path} lacks {len(missing)} LoRA tensors of this model "
                          f"(e.g. {missing[0]}): it was trained on another base or target_modules")
    trainer.step = state["step"]
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    dist, ranks = _dist(trainer), state.get("rng_ranks") or [state["rng"]]
    if len(ranks) != dist.world and dist.is_main:
        log.warning("resume: checkpoint %s was written by %d process(es), this run has %d: the prompts and the "
                    "adapter continue exactly, the random streams of the processes do not", path.name, len(ranks),
                    dist.world)
    _set_rng_state(ranks[dist.rank] if len(ranks) == dist.world else state["rng"])
    trainer.prompts.load_state_dict(state["prompts"])
    trainer.engine.load_state_dict(state["engine"])
    trainer.engine.sync(trainer.model)  # the engine samples from the restored adapter
    trainer.monitor.load_state_dict(state["monitor"])
    trainer.skipped_steps = state["skipped_steps"]
    trainer.no_signal_steps = state.get("no_signal_steps", 0)
    trainer.eval_before = state["eval_before"]
    trainer.rewards.total_failures = dict(state["reward_failures"])


def load(trainer, path: Path) -> None:
    apply(trainer, read(path))


def load_latest(trainer, run) -> CheckpointData:
    """Load the newest checkpoint of `run` that reads back whole; skip (and set aside) corrupt ones.

    ResumeError when there is none, or none that loads (the message lists each and why)."""
    for note in run.recover():
        log.warning("resume %s: %s", run.path, note)
    ckpts = run.checkpoints()
    if not ckpts:
        raise ResumeError(f"--resume {run.path}: no checkpoint in {run.ckpt_dir} to continue from "
                          f"(set train.save_every to checkpoint during a run)")
    skipped = []
    for path in reversed(ckpts):
        try:
            data = read(path)
        except CorruptCheckpoint as e:
            aside = path.with_name(f".corrupt-{path.name}-{time.strftime('%Y%m%d-%H%M%S')}")
            os.rename(path, aside)
            skipped.append(f"{path.name}: {e}")
            log.warning("resume: skipping checkpoint %s (%s); kept as %s", path.name, e, aside.name)
            continue
        apply(trainer, data)
        if skipped:
            log.warning("resume: continuing from %s, the newest checkpoint that loads", path.name)
        return data
    raise ResumeError(f"--resume {run.path}: no checkpoint loads: " + "; ".join(skipped))
