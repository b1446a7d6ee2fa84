"""Checkpoints of a run: everything needed to continue bit for bit.

A checkpoint holds the LoRA adapter (peft format, `adapter/`) and `trainer_state.pt`:
optimizer, LR scheduler, RNG states (python, numpy, torch), prompt-order position, step,
monitor state, and the rollout engine's sampling seed position. RunDir writes it atomically.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import torch

STATE_FILE = "trainer_state.pt"


class ResumeError(RuntimeError):
    pass


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


def save(trainer) -> Path:
    state = {
        "step": trainer.step,
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.scheduler.state_dict(),
        "rng": _rng_state(),
        "prompts": trainer.prompts.state_dict(),
        "engine": trainer.engine.state_dict(),
        "monitor": trainer.monitor.state_dict(),
        "skipped_steps": trainer.skipped_steps,
        "no_signal_steps": trainer.no_signal_steps,
        "eval_before": trainer.eval_before,
        "reward_failures": trainer.rewards.total_failures,
    }

    def write(tmp: Path) -> None:
        trainer.model.save_pretrained(tmp / "adapter")
        torch.save(state, tmp / STATE_FILE)

    return trainer.run.save_checkpoint(trainer.step, write, trainer.cfg.train.keep_last)


def load(trainer, path: Path) -> None:
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    adapter_file = Path(path) / "adapter" / "adapter_model.safetensors"
    if not adapter_file.exists():
        raise ResumeError(f"checkpoint {path} has no adapter ({adapter_file} missing)")
    weights = load_file(str(adapter_file))
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
    state = torch.load(Path(path) / STATE_FILE, weights_only=False)
    trainer.step = state["step"]
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    _set_rng_state(state["rng"])
    trainer.prompts.load_state_dict(state["prompts"])
    trainer.engine.load_state_dict(state["engine"])
    trainer.engine.sync(trainer.model)  # the engine samples from the restored adapter
    trainer.monitor.load_state_dict(state["monitor"])
    trainer.skipped_steps = state["skipped_steps"]
    trainer.no_signal_steps = state.get("no_signal_steps", 0)
    trainer.eval_before = state["eval_before"]
    trainer.rewards.total_failures = dict(state["reward_failures"])
