"""Switches compose, or are refused here: a combination of the run's switches either runs with the same
invariants as each switch alone (every step logged once, every phase reading the same current config, a
resume continuing the same steps), or is refused when the config is resolved, before anything loads,
naming the field and what to change. Never half-run. tests/test_switches.py runs the switches in pairs and
checks each refusal below.

A refusal that depends on the config only belongs in `REFUSALS`, not in the code that would fail later.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Callable

from tinyrl.config.coerce import check
from tinyrl.errors import MissingExtra

SFT_METHODS = ("sft", "rest_em", "star")  # methods that train through TRL's SFTTrainer on one process
OVERLAP_ENGINES = ("hf", "vllm_server")  # engines one-step-off samples from a copy of the policy with (`bound_to`)


def world_size(cfg) -> int:
    """Processes the run will have: dist.nproc, or the launcher's (WORLD_SIZE) when it started more."""
    return max(cfg.dist.nproc, int(os.environ.get("WORLD_SIZE", "1") or 1))


def methods_of(cfg) -> list[str]:
    return list(cfg.stages) or ["grpo"]


@dataclass(frozen=True)
class Refusal:
    field: str  # the dotted field the message names
    refused: Callable[[object, int], bool]  # (config, processes) -> is this combination refused?
    why: str  # what runs instead, and what to change


REFUSALS = (
    Refusal("agent.streaming", lambda c, w: c.agent.streaming and not c.agent.enabled,
            "streams multi-turn tool episodes (a trajectory whose tool returned rejoins the decode batch); this "
            "run has no agent (agent.enabled: false): set agent.enabled: true, or agent.streaming: false"),
    Refusal("rollout.overlap", lambda c, w: c.rollout.overlap and c.rollout.engine not in OVERLAP_ENGINES,
            "one-step-off runs with the hf and vllm_server engines (and agents on them), not {c.rollout.engine}: a "
            "colocated vLLM engine would need its weight sync inside the hand-over; set rollout.overlap: false, or "
            "rollout.engine: vllm_server (a server on devices of its own)"),
    Refusal("stages", lambda c, w: w > 1 and any(m in SFT_METHODS for m in methods_of(c)),
            "{methods} run on one process (SFT through TRL, ReST-EM and STaR sample and fine-tune in turn); "
            "GRPO is what scales out: launch the SFT stages with dist.nproc: 1"),
    Refusal("train.eval_before_after", lambda c, w: c.train.eval_before_after and (
                c.data.num_eval == 0 or (c.data.task == "dataset" and not c.data.eval_split and c.data.eval_fraction == 0)),
            "measures held-out accuracy before and after training, but this run holds no prompt out (data.num_eval: "
            "{c.data.num_eval}, data.eval_fraction: {c.data.eval_fraction}); hold some out, or set "
            "train.eval_before_after: false"),
    Refusal("log.push_to_hub", lambda c, w: bool(c.log.push_to_hub) and "grpo" not in methods_of(c),
            "pushes the GRPO trainer's checkpoints while it trains (tinyrl.hub_sync); stages {c.stages} have no grpo "
            "stage: set log.push_to_hub: null and upload the finished run with `tinyrl export RUN --push REPO`"),
    Refusal("train.prompts_per_step", lambda c, w: c.train.prompts_per_step % w != 0,
            "must divide by the {w} processes (dist.nproc = {c.dist.nproc}, or the launcher's WORLD_SIZE): every "
            "process takes whole groups; got {c.train.prompts_per_step}"),
)


def check_switches(cfg) -> None:
    """ConfigError naming the field of the first refused combination (see the module docstring)."""
    w = world_size(cfg)
    for r in REFUSALS:
        methods = ", ".join(m for m in methods_of(cfg) if m in SFT_METHODS)
        check(not r.refused(cfg, w), r.field, r.why.format(c=cfg, w=w, methods=methods))


# (field, does the run use it?, the package it needs, the extra that installs it): checked for the process that
# trains (resolve with decide_auto), by name only (importlib.util.find_spec imports nothing)
NEEDS = (
    ("model.quantization", lambda c: c.model.quantization != "none", "torchao", "torchao"),
    ("rollout.engine", lambda c: c.rollout.engine == "vllm", "vllm", "vllm"),
    ("model.backend", lambda c: c.model.backend == "unsloth", "unsloth", "unsloth"),
    ("stages", lambda c: any(m in SFT_METHODS for m in methods_of(c)), "trl", "sft"),
    ("algo.loss_impl", lambda c: c.algo.loss_impl == "triton", "triton", "kernels"),
)


def check_installed(cfg) -> None:
    """MissingExtra naming the field, the package and the extra, for an optional package the run needs."""
    for field, used, package, extra in NEEDS:
        if used(cfg) and importlib.util.find_spec(package) is None:
            raise MissingExtra(f"{field}: this run needs {package}, which is not installed: "
                               f"pip install 'tinyrl-rlvr[{extra}]'")
    check_hub_login(cfg)


def check_hub_login(cfg) -> None:
    """log.push_to_hub needs a hub login before the first step, not at the first save: HF_TOKEN or the token
    `hf auth login` saved (read locally; nothing is sent)."""
    if cfg.log.push_to_hub:
        from huggingface_hub import get_token  # a dependency of tinyrl itself (transformers needs it too)

        check(bool(get_token()), "log.push_to_hub", f"pushing to {cfg.log.push_to_hub} needs a Hugging Face login: "
              f"run `hf auth login` (or set HF_TOKEN to a token with write access), or set log.push_to_hub: null")
