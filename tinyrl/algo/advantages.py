"""Advantage estimators: rewards of B prompts x G samples -> advantages.

Pure tensor math, the reference semantics for the grouped-advantage kernel. Rewards that
are NaN (a verifier failed on that sample) are left out of every statistic and get
advantage 0. Sequence-level estimators return [N]; token-level ones return [N, T].

    >>> r = torch.tensor([1., 0., 0., 1.]); g = torch.tensor([0, 0, 1, 1])
    >>> ESTIMATORS["dr_grpo"](AdvantageInputs(r, g, scale="none")).advantages
    tensor([ 0.5000, -0.5000, -0.5000,  0.5000])

Every estimator in `ESTIMATORS` computes in float64 and hands its advantages back in the rewards'
dtype: finite rewards as large as float32 holds (1e38) keep finite means, stds and whitening (in
float32 their squares overflow to inf and the advantages collapse to 0).

    >>> huge = torch.tensor([1e38, 2e38, 2e38, 1e38])
    >>> ESTIMATORS["grpo"](AdvantageInputs(huge, g, scale="batch")).advantages
    tensor([-0.8660,  0.8660,  0.8660, -0.8660])
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Callable

import torch


@dataclass
class AdvantageInputs:
    rewards: torch.Tensor  # [N] float, NaN = excluded
    group: torch.Tensor  # [N] long, prompt index of each row
    scale: str = "group"  # group | batch | none
    eps: float = 1e-4
    mask: torch.Tensor | None = None  # [N, T] completion mask (token-level estimators)
    kl: torch.Tensor | None = None  # [N, T] per-token KL(policy || reference) estimate (k1)
    beta: float = 0.0


@dataclass
class AdvantageOutput:
    advantages: torch.Tensor  # [N] or [N, T]
    zero_std_frac: float  # fraction of groups (with >= 2 valid rewards) whose rewards are all equal
    group_std_mean: float  # mean within-group reward std over those groups


def group_stats(rewards: torch.Tensor, group: torch.Tensor):
    """Per-row group mean and unbiased std over valid (non-NaN) rewards, plus group counts.

    Returns (mean [N], std [N], count [N], per-group std [B], per-group count [B]).
    """
    valid = ~torch.isnan(rewards)
    r = torch.where(valid, rewards, torch.zeros_like(rewards)).double()
    B = int(group.max()) + 1 if group.numel() else 0
    cnt = torch.zeros(B, dtype=torch.float64).index_add_(0, group, valid.double())
    s = torch.zeros(B, dtype=torch.float64).index_add_(0, group, r)
    mean_g = s / cnt.clamp(min=1)
    dev = torch.where(valid, r - mean_g[group], torch.zeros_like(r))
    ss = torch.zeros(B, dtype=torch.float64).index_add_(0, group, dev * dev)
    std_g = torch.sqrt(ss / (cnt - 1).clamp(min=1))
    std_g = torch.where(cnt >= 2, std_g, torch.zeros_like(std_g))
    dt = rewards.dtype
    return mean_g[group].to(dt), std_g[group].to(dt), cnt[group].to(dt), std_g.to(dt), cnt.to(dt)


def _summary(rewards, group) -> tuple[float, float]:
    _, _, _, std_g, cnt_g = group_stats(rewards, group)
    ok = cnt_g >= 2
    if not ok.any():
        return 0.0, 0.0
    return float((std_g[ok] == 0).float().mean()), float(std_g[ok].mean())


def _scaled(centered: torch.Tensor, x: AdvantageInputs, std_row: torch.Tensor) -> torch.Tensor:
    valid = ~torch.isnan(x.rewards)
    if x.scale == "group":
        centered = centered / (std_row + x.eps)
    elif x.scale == "batch":
        v = x.rewards[valid]
        std = v.std() if v.numel() > 1 else v.new_zeros(())
        centered = centered / (std + x.eps)
    elif x.scale != "none":
        raise ValueError(f"scale must be group | batch | none, got {x.scale!r}")
    return torch.where(valid, centered, torch.zeros_like(centered))


def grpo(x: AdvantageInputs) -> AdvantageOutput:
    """(r - mean_group) / (std + eps), std from `scale` (DeepSeekMath, arXiv 2402.03300)."""
    mean, std, _, _, _ = group_stats(x.rewards, x.group)
    return AdvantageOutput(_scaled(x.rewards - mean, x, std), *_summary(x.rewards, x.group))


def dr_grpo(x: AdvantageInputs) -> AdvantageOutput:
    """r - mean_group, never divided by a std (Dr. GRPO, arXiv 2503.20783)."""
    mean, _, _, _, _ = group_stats(x.rewards, x.group)
    adv = torch.where(torch.isnan(x.rewards), torch.zeros_like(x.rewards), x.rewards - mean)
    return AdvantageOutput(adv, *_summary(x.rewards, x.group))


def rloo(x: AdvantageInputs) -> AdvantageOutput:
    """r_i - mean of the other samples of its group (RLOO, arXiv 2402.14740)."""
    mean, std, cnt, _, _ = group_stats(x.rewards, x.group)
    loo = x.rewards - (mean * cnt - x.rewards) / (cnt - 1).clamp(min=1)
    loo = torch.where(cnt >= 2, loo, torch.zeros_like(loo))
    return AdvantageOutput(_scaled(loo, x, std), *_summary(x.rewards, x.group))


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(v - mean) / sqrt(var + eps) over masked entries (unbiased var), zero elsewhere."""
    m = mask.to(values.dtype)
    n = m.sum()
    mean = (values * m).sum() / n.clamp(min=1)
    var = (((values - mean) * m) ** 2).sum() / (n - 1).clamp(min=1)
    return (values - mean) * torch.rsqrt(var + eps) * m


def _token_outcome(x: AdvantageInputs, per_seq: torch.Tensor) -> torch.Tensor:
    if x.mask is None:
        raise ValueError("token-level estimators need the completion mask")
    return per_seq[:, None] * x.mask.to(per_seq.dtype)


def reinforce_pp(x: AdvantageInputs) -> AdvantageOutput:
    """REINFORCE++ (arXiv 2501.03262): token rewards = outcome at the last token - beta * k1 KL,
    returns-to-go (gamma = 1), whitened over all valid tokens of the batch."""
    valid = ~torch.isnan(x.rewards)
    if x.mask is None:
        raise ValueError("reinforce_pp needs the completion mask")
    m = x.mask.to(x.rewards.dtype) * valid[:, None]
    token_r = torch.zeros_like(m)
    last = (x.mask.sum(-1) - 1).clamp(min=0).long()
    token_r[torch.arange(len(last)), last] = torch.nan_to_num(x.rewards, nan=0.0)
    if x.kl is not None and x.beta > 0:
        token_r = token_r - x.beta * x.kl * m
    returns = torch.flip(torch.cumsum(torch.flip(token_r * m, [1]), 1), [1])
    return AdvantageOutput(masked_whiten(returns, m), *_summary(x.rewards, x.group))


def reinforce_pp_baseline(x: AdvantageInputs) -> AdvantageOutput:
    """r - group mean, broadcast to tokens, then whitened over all valid tokens of the batch."""
    mean, _, _, _, _ = group_stats(x.rewards, x.group)
    valid = ~torch.isnan(x.rewards)
    centered = torch.where(valid, x.rewards - mean, torch.zeros_like(x.rewards))
    m = x.mask.to(x.rewards.dtype) * valid[:, None] if x.mask is not None else None
    return AdvantageOutput(masked_whiten(_token_outcome(x, centered), m), *_summary(x.rewards, x.group))


def in_float64(estimator: Callable[[AdvantageInputs], AdvantageOutput]) -> Callable[[AdvantageInputs], AdvantageOutput]:
    """`estimator` run on float64 rewards and KL, its advantages returned in the rewards' dtype."""

    @functools.wraps(estimator)
    def run(x: AdvantageInputs) -> AdvantageOutput:
        kl = None if x.kl is None else x.kl.double()
        out = estimator(replace(x, rewards=x.rewards.double(), kl=kl))
        return replace(out, advantages=out.advantages.to(x.rewards.dtype))

    return run


ESTIMATORS: dict[str, Callable[[AdvantageInputs], AdvantageOutput]] = {
    name: in_float64(fn) for name, fn in {
        "grpo": grpo,
        "dr_grpo": dr_grpo,
        "rloo": rloo,
        "reinforce_pp": reinforce_pp,
        "reinforce_pp_baseline": reinforce_pp_baseline,
    }.items()
}
