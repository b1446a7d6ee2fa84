"""The one data type that travels between phases, and the rollout-engine interface.

Every engine returns a `Rollouts` for B prompts x G samples; rewards, advantages and the
policy update read and fill its fields. Shapes use N = B*G rows, P = prompt length
(left-padded), T = completion length (right-padded).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import torch


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop: list[str] = field(default_factory=list)


@dataclass
class Rollouts:
    prompt_ids: torch.Tensor  # [N, P] left-padded prompt token ids
    prompt_mask: torch.Tensor  # [N, P] 1 on real prompt tokens
    completion_ids: torch.Tensor  # [N, T] right-padded sampled token ids
    completion_mask: torch.Tensor  # [N, T] 1 on real completion tokens (sampled + tool observations), up to EOS / stop
    loss_mask: torch.Tensor  # [N, T] tokens the policy loss sees: a subset of action_mask
    sampling_logprobs: torch.Tensor  # [N, T] engine logprob of each sampled token (at its temperature)
    group: torch.Tensor  # [N] prompt index 0..B-1 of each row
    truncated: torch.Tensor  # [N] bool: hit max_new_tokens without EOS / stop
    prompts: list[str]  # [N] prompt text of each row
    completions: list[str]  # [N] decoded completion text
    columns: list[dict[str, Any]]  # [N] dataset columns of each row's prompt (answer, ...)
    rewards: torch.Tensor | None = None  # [N] weighted total; NaN = excluded (verifier failed)
    reward_components: dict[str, torch.Tensor] = field(default_factory=dict)  # name -> [N]
    advantages: torch.Tensor | None = None  # [N] (or [N, T] for token-level estimators)
    old_logprobs: torch.Tensor | None = None  # [N, T] trainer logprobs before the update
    ref_logprobs: torch.Tensor | None = None  # [N, T] reference (adapter off) logprobs, when beta > 0
    observation_mask: torch.Tensor | None = None  # [N, T] 1 on tool-observation tokens (not sampled); None = none

    def __post_init__(self):
        if self.observation_mask is None:
            self.observation_mask = torch.zeros_like(self.completion_mask)

    @property
    def action_mask(self) -> torch.Tensor:  # [N, T] the tokens the policy sampled
        return self.completion_mask * (1 - self.observation_mask)

    @property
    def num_rows(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def completion_lengths(self) -> torch.Tensor:  # [N] tokens the policy sampled (observations excluded)
        return self.action_mask.sum(-1)

    def select(self, rows: torch.Tensor | list[int]) -> "Rollouts":
        """A new batch holding only `rows` (groups renumbered 0..B'-1 in order of appearance)."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                out[f.name] = v[idx]
            elif isinstance(v, list):
                out[f.name] = [v[i] for i in idx.tolist()]
            elif isinstance(v, dict):
                out[f.name] = {k: t[idx] for k, t in v.items()}
            else:
                out[f.name] = v
        _, out["group"] = torch.unique(out["group"], sorted=False, return_inverse=True)
        return Rollouts(**out)

    @staticmethod
    def concat(parts: list["Rollouts"]) -> "Rollouts":
        """Stack batches row-wise, padding prompts on the left and completions on the right."""
        if len(parts) == 1:
            return parts[0]
        P = max(r.prompt_ids.shape[1] for r in parts)
        T = max(r.completion_ids.shape[1] for r in parts)
        out: dict[str, Any] = {}
        offset = 0
        groups = []
        for r in parts:
            groups.append(r.group + offset)
            offset += int(r.group.max()) + 1 if r.num_rows else 0
        out["group"] = torch.cat(groups)
        for f in fields(Rollouts):
            if f.name == "group":
                continue
            vals = [getattr(r, f.name) for r in parts]
            if vals[0] is None:
                out[f.name] = None
            elif isinstance(vals[0], list):
                out[f.name] = [x for v in vals for x in v]
            elif isinstance(vals[0], dict):
                out[f.name] = {k: torch.cat([v[k] for v in vals]) for k in vals[0]}
            elif f.name.startswith("prompt"):
                out[f.name] = torch.cat([_pad(v, P, left=True) for v in vals])
            elif vals[0].dim() == 2:
                out[f.name] = torch.cat([_pad(v, T, left=False) for v in vals])
            else:
                out[f.name] = torch.cat(vals)
        return Rollouts(**out)


def _pad(t: torch.Tensor, width: int, left: bool) -> torch.Tensor:
    extra = width - t.shape[1]
    if extra == 0:
        return t
    pad = t.new_zeros(t.shape[0], extra)
    return torch.cat([pad, t] if left else [t, pad], dim=1)


class RolloutEngine(Protocol):
    """What the trainer, the evaluation and the checkpoints need from a generator. Engines own all
    of their internals; nothing else of an engine is read from outside it."""

    def generate(self, prompts: list[str], n: int, params: SamplingParams,
                 columns: list[dict] | None = None, greedy: bool = False) -> Rollouts:
        """n samples of each prompt (prompt-major rows), or the greedy completion when `greedy`."""

    def release(self) -> None:
        """Free generation memory (KV cache) before the update phase; weights stay."""

    def sync(self, model) -> None:
        """Make the engine sample from the current trained weights (LoRA adapter only)."""

    def state_dict(self) -> dict:
        """The sampling RNG position (saved in checkpoints, so a resumed run draws the same samples)."""

    def load_state_dict(self, state: dict) -> None: ...
