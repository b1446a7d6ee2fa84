"""The run config's sections of the methods beside GRPO: `sft` (tinyrl/methods/sft.py) and
`selfimprove` (ReST-EM and STaR, tinyrl/methods/selfimprove.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

from tinyrl.config.coerce import check, check_local


@dataclass
class SFTConfig:
    """The `sft` stage and `tinyrl sft` (tinyrl/methods/sft.py): LoRA/QLoRA SFT through TRL's SFTTrainer.

    Rows come from `data`: a jsonl file of prompt/completion rows, a run folder (its
    samples.jsonl, filtered by `min_reward`), "demonstrations" (an agent task's expert
    trajectories, replayed through the run's tools), or, when null, the task's own train rows
    with their `completion_column` (the arithmetic task's true answers)."""

    LIMITS = {"max_per_prompt": (1, 1_000_000), "epochs": (0, 1000), "max_steps": (1, 10_000_000),
              "batch_size": (1, 65536), "grad_accum": (1, 65536), "max_length": (1, 10_000_000),
              "logging_steps": (1, 10_000_000), "save_every": (0, 10_000_000)}

    data: Optional[str] = None  # jsonl file | run folder | "demonstrations" (an agent task's) | null (the task's train rows)
    prompt_column: str = "prompt"
    completion_column: Optional[str] = None  # null: "completion" (files, run folders) or "answer" (task rows)
    min_reward: Optional[float] = None  # keep rows whose `reward` >= this; required for a run folder
    max_per_prompt: Optional[int] = None  # keep at most this many rows per distinct prompt
    epochs: float = 1.0
    max_steps: Optional[int] = None  # optimiser steps; set, it overrides epochs
    lr: float = 2e-4
    batch_size: int = 16  # rows per optimiser step (before grad_accum)
    grad_accum: int = 1
    max_length: Optional[int] = 1024  # tokens per row (prompt + completion); longer rows are cut
    scheduler: Literal["constant", "linear", "cosine"] = "linear"
    warmup_ratio: float = 0.0
    completion_only_loss: bool = True  # loss on completion tokens only (the prompt is context)
    logging_steps: int = 1  # a metrics.jsonl row every N optimiser steps
    save_every: int = 0  # a TRL checkpoint every N optimiser steps; 0 = none (an interrupt still saves one)

    def validate(self, p: str) -> None:
        if self.data is not None and self.data != "demonstrations":  # tinyrl.agents.demonstrations.DEMONSTRATIONS
            path = Path(self.data)
            check_local(self.data, f"{p}.data", hint=" (a jsonl file of prompt/completion rows or a run folder)")
            if path.is_dir():
                check((path / "samples.jsonl").is_file(), f"{p}.data", f"{self.data} is a folder without samples.jsonl; is it a tinyrl run folder?")
                check(self.min_reward is not None, f"{p}.min_reward", "is required when sft.data is a run folder "
                       "(its samples carry rewards; e.g. 1.0 keeps the verifier-correct ones)")
        check(self.max_per_prompt is None or self.max_per_prompt >= 1, f"{p}.max_per_prompt", f"must be >= 1 or null, got {self.max_per_prompt}")
        check(self.epochs > 0, f"{p}.epochs", f"must be > 0, got {self.epochs}")
        check(self.max_steps is None or self.max_steps >= 1, f"{p}.max_steps", f"must be >= 1 or null, got {self.max_steps}")
        check(self.lr > 0, f"{p}.lr", f"must be > 0, got {self.lr}")
        check(self.batch_size >= 1, f"{p}.batch_size", f"must be >= 1, got {self.batch_size}")
        check(self.grad_accum >= 1, f"{p}.grad_accum", f"must be >= 1, got {self.grad_accum}")
        check(self.max_length is None or self.max_length >= 2, f"{p}.max_length", f"must be >= 2 or null, got {self.max_length}")
        check(0 <= self.warmup_ratio < 1, f"{p}.warmup_ratio", f"must be in [0, 1), got {self.warmup_ratio}")
        check(self.logging_steps >= 1, f"{p}.logging_steps", f"must be >= 1, got {self.logging_steps}")
        check(self.save_every >= 0, f"{p}.save_every", f"must be >= 0, got {self.save_every}")


@dataclass
class SelfImproveConfig:
    """The `rest_em` and `star` stages (tinyrl/methods/selfimprove.py). Each iteration samples
    `samples_per_prompt` completions for `prompts_per_iter` train prompts from the latest
    iterate, keeps those whose reward >= `min_reward`, and fine-tunes the base (never the
    previous iterate) on them with the `sft` section's switches. STaR also samples
    `hint_samples` completions for each prompt that found no correct one, with the task's hint."""

    LIMITS = {"iterations": (1, 1000), "prompts_per_iter": (1, 1_000_000), "samples_per_prompt": (1, 1024),
              "max_per_prompt": (1, 1024), "hint_samples": (0, 1024)}

    iterations: int = 3  # K
    prompts_per_iter: int = 128
    samples_per_prompt: int = 8  # N, at rollout.temperature / top_p / max_new_tokens
    max_per_prompt: Optional[int] = None  # cap on kept completions per prompt (distinct ones first)
    min_reward: float = 1.0  # keep a completion when its total reward (reward.functions) >= this
    hint_samples: int = 4  # STaR rationalisation: samples per failed prompt, with the hint

    def validate(self, p: str) -> None:
        check(self.iterations >= 1, f"{p}.iterations", f"must be >= 1, got {self.iterations}")
        check(self.prompts_per_iter >= 1, f"{p}.prompts_per_iter", f"must be >= 1, got {self.prompts_per_iter}")
        check(self.samples_per_prompt >= 1, f"{p}.samples_per_prompt", f"must be >= 1, got {self.samples_per_prompt}")
        check(self.max_per_prompt is None or self.max_per_prompt >= 1, f"{p}.max_per_prompt", f"must be >= 1 or null, got {self.max_per_prompt}")
        check(self.hint_samples >= 0, f"{p}.hint_samples", f"must be >= 0, got {self.hint_samples}")
