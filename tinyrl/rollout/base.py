"""The one data type that travels between phases (the engine interface: tinyrl.rollout.engine).

Every engine returns a `Rollouts` for B prompts x G samples; rewards, advantages and the
policy update read and fill its fields. Shapes use N = B*G rows, P = prompt length
(left-padded), T = completion length (right-padded).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields
from typing import Any

import torch

# why a sample ended: the EOS token, a stop string, the token budget; "paused": stopped by its caller (a
# partial rollout continues it later from its context + these tokens)
FINISH = ("eos", "stop", "length", "paused")


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop: list[str] = field(default_factory=list)
    # Sample streams: context i of a call draws from the engine's stream `stream + i`, whichever call,
    # batch or rank draws it (the trainer passes each prompt's position in the run's prompt stream, so
    # a prompt's samples do not depend on how the batch is split over processes); None: per call.
    stream: int | None = None


def stream_seed(*key) -> int:
    """A 63-bit seed for a generator keyed by (engine seed, ...), the same in every process.

    >>> stream_seed(0, "prompt", 5) == stream_seed(0, "prompt", 5) != stream_seed(0, "prompt", 6)
    True
    """
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little") >> 1


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
    trajectories: list[dict] | None = None  # [N] multi-turn rows: turns, tool calls, errors, the turn log
    # [N, T] the policy version (optimiser steps taken) whose adapter sampled each token: partial rollouts
    # (tinyrl.inflight) continue a row across steps; None = every token sampled by the current adapter
    versions: torch.Tensor | None = None

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
            elif v is None:
                out[f.name] = None
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
                out[f.name] = torch.cat([pad_to(v, P, left=True) for v in vals])
            elif vals[0].dim() == 2:
                out[f.name] = torch.cat([pad_to(v, T, left=False) for v in vals])
            else:
                out[f.name] = torch.cat(vals)
        return Rollouts(**out)


@dataclass
class Sample:
    """One sampled continuation, exactly as the engine drew it."""

    token_ids: list[int]  # the sampled ids (the EOS token or the token that completed a stop string included)
    logprobs: list[float]  # log p of each sampled token under the sampling distribution (at its temperature)
    finish: str  # one of FINISH


def pack_rollouts(tok, prompt_ids: list[list[int]], completions: list[list[int]], logprobs: list[list[float]],
                  truncated: list[bool], group: list[int], prompts: list[str], columns: list[dict],
                  observation: list[list[int]] | None = None, trajectories: list[dict] | None = None,
                  versions: list[list[int]] | None = None) -> Rollouts:
    """Rows of token ids (never re-tokenised text) -> one padded Rollouts batch.

    `observation[i][t]` = 1 marks a tool-observation token of row i (multi-turn); such tokens carry
    logprob 0, count for attention and nothing else. `versions[i][t]`: the policy version that sampled
    token t of row i (partial rollouts)."""
    N = len(completions)
    P = max((len(p) for p in prompt_ids), default=0)
    T = max((len(c) for c in completions), default=0)
    pad = tok.pad_token_id
    p_ids = torch.full((N, P), pad, dtype=torch.long)
    p_mask = torch.zeros((N, P), dtype=torch.long)
    c_ids = torch.full((N, T), pad, dtype=torch.long)
    c_mask = torch.zeros((N, T), dtype=torch.long)
    obs = torch.zeros((N, T), dtype=torch.long)
    lp = torch.zeros((N, T), dtype=torch.float32)
    ver = None if versions is None else torch.zeros((N, T), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompt_ids, completions)):
        if p:
            p_ids[i, P - len(p):] = torch.tensor(p)
            p_mask[i, P - len(p):] = 1
        if c:
            c_ids[i, :len(c)] = torch.tensor(c)
            c_mask[i, :len(c)] = 1
            lp[i, :len(c)] = torch.tensor(logprobs[i], dtype=torch.float32)
            if observation is not None:
                obs[i, :len(c)] = torch.tensor(observation[i])
            if ver is not None:
                ver[i, :len(c)] = torch.tensor(versions[i])
    action = c_mask * (1 - obs)
    return Rollouts(
        prompt_ids=p_ids, prompt_mask=p_mask, completion_ids=c_ids, completion_mask=c_mask,
        loss_mask=action.clone(), sampling_logprobs=lp * action, group=torch.tensor(group, dtype=torch.long),
        truncated=torch.tensor(truncated, dtype=torch.bool), prompts=list(prompts),
        completions=tok.batch_decode(completions, skip_special_tokens=True), columns=list(columns),
        observation_mask=obs, trajectories=trajectories, versions=ver,
    )


def generate_from_text(engine, prompts: list[str], n: int, params: SamplingParams, columns: list[dict] | None,
                       greedy: bool) -> Rollouts:
    """`RolloutEngine.generate` for an engine with `sample(contexts, params, n, greedy)`: each prompt is
    encoded once, its n samples become n prompt-major rows of one group."""
    tok = engine.tokenizer
    ids = tok(list(prompts), add_special_tokens=False)["input_ids"]
    groups = engine.sample(ids, params, n=n, greedy=greedy)
    rows = [(i, s) for i, g in enumerate(groups) for s in g]
    cols = columns if columns is not None else [{} for _ in prompts]
    return pack_rollouts(tok, [ids[i] for i, _ in rows], [s.token_ids for _, s in rows],
                         [s.logprobs for _, s in rows], [s.finish == "length" for _, s in rows],
                         [i for i, _ in rows], [prompts[i] for i, _ in rows], [cols[i] for i, _ in rows])


class StopStrings:
    """Has a row's newest text completed one of the stop strings? Checked on a short tail of
    tokens per step (a stop string found once ends the row, so only new text can hold one)."""

    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer, self.stop = tokenizer, [s for s in stop if s]
        self.window = max((len(s) for s in self.stop), default=0) + 2  # tokens: each covers >= 1 character

    def __bool__(self) -> bool:
        return bool(self.stop)

    def hit(self, tails: list[list[int]]) -> list[bool]:
        texts = self.tokenizer.batch_decode([t[-self.window:] for t in tails], skip_special_tokens=True)
        return [any(s in x for s in self.stop) for x in texts]


def pad_to(t: torch.Tensor, width: int, left: bool, dim: int = 1) -> torch.Tensor:
    """`t` with zeros added along `dim` (before it when `left`) up to `width`."""
    extra = width - t.shape[dim]
    if extra == 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    pad = t.new_zeros(shape)
    return torch.cat([pad, t] if left else [t, pad], dim=dim)
