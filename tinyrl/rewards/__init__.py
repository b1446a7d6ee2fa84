"""Verifiers and reward functions (TRL signature), and the weighted reward set of a run."""

from tinyrl.rewards.core import REWARDS, RewardSet, register, resolve_reward, score_rollouts

__all__ = ["REWARDS", "RewardSet", "register", "resolve_reward", "score_rollouts"]
