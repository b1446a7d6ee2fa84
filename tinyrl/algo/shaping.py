"""Reward shaping and group filtering (DAPO): pure tensor math.

    >>> overlong_penalty(torch.tensor([10, 14, 16]), max_len=16, buffer=4, penalty=1.0)
    tensor([ 0.0000, -0.5000, -1.0000])
"""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer: int, penalty: float = 1.0) -> torch.Tensor:
    """DAPO soft overlong punishment: 0 up to max_len - buffer, then linear down to -penalty
    at max_len, and -penalty beyond."""
    lengths = lengths.float()
    start = max_len - buffer
    inside = (start - lengths) / max(buffer, 1) * penalty
    return torch.where(lengths <= start, torch.zeros_like(lengths),
                       torch.where(lengths <= max_len, inside, torch.full_like(lengths, -penalty)))


def informative_groups(rewards: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """[B] bool: groups whose valid (non-NaN) rewards are not all equal (DAPO dynamic sampling).

    >>> informative_groups(torch.tensor([1., 1., 0., 1.]), torch.tensor([0, 0, 1, 1]))
    tensor([False,  True])
    """
    B = int(group.max()) + 1 if group.numel() else 0
    valid = ~torch.isnan(rewards)
    r = torch.where(valid, rewards, torch.zeros_like(rewards))
    big = torch.full((B,), float("inf"))
    lo = big.scatter_reduce(0, group, torch.where(valid, r, torch.full_like(r, float("inf"))), "amin")
    hi = (-big).scatter_reduce(0, group, torch.where(valid, r, torch.full_like(r, float("-inf"))), "amax")
    return hi > lo
