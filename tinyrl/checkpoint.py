"""Checkpoint files of a run: everything needed to continue bit for bit.

A checkpoint holds the LoRA adapter (peft format, `adapter/`) and `trainer_state.pt`, the dict
the trainer's `state_dict()` gives (its `TrainerState`, optimizer, LR scheduler, RNG states,
prompt-order position, the engine's sampling position, the monitor, the config). The trainer
owns what goes in and how it is restored; this module owns the files: `write` (atomic, through
RunDir), `read` (checked whole), `newest` (skipping corrupt ones), and RNG capture.

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
from safetensors.torch import load_file

from tinyrl.errors import ResumeError

log = logging.getLogger("tinyrl.checkpoint")
STATE_FILE = "trainer_state.pt"
ADAPTER_FILE = "adapter/adapter_model.safetensors"
STATE_KEYS = ("trainer", "optimizer", "scheduler", "rng", "prompts", "engine", "monitor", "reward_failures")
OLD_COUNTERS = ("step", "skipped_steps", "no_signal_steps", "eval_before")  # top-level before TrainerState


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


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.random.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(s: dict) -> None:
    random.setstate(s["python"])
    np.random.set_state(s["numpy"])
    torch.random.set_rng_state(s["torch"])
    if s.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def write(run, step: int, model, state: dict, keep_last: int) -> Path:
    """Write checkpoint `step` (the adapter and `state`) atomically; rank 0's RunDir writes, others' nothing."""

    def files(tmp: Path) -> None:
        model.save_pretrained(tmp / "adapter")
        torch.save(state, tmp / STATE_FILE)

    return run.save_checkpoint(step, files, keep_last)


def read(path: Path) -> CheckpointData:
    """Both files of a checkpoint, read and checked; CorruptCheckpoint naming the file otherwise."""
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
    if isinstance(state, dict) and "trainer" not in state and all(k in state for k in OLD_COUNTERS[:2]):
        state["trainer"] = {k: state.pop(k) for k in OLD_COUNTERS if k in state}  # written before TrainerState
    missing = [k for k in STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise CorruptCheckpoint(f"{state_file} lacks {missing}: not a tinyrl trainer state")
    return CheckpointData(path, weights, state)


def newest(run) -> CheckpointData:
    """The newest checkpoint of `run` that reads back whole; corrupt ones are skipped (and set aside).

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
        if skipped:
            log.warning("resume: continuing from %s, the newest checkpoint that loads", path.name)
        return data
    raise ResumeError(f"--resume {run.path}: no checkpoint loads: " + "; ".join(skipped))
