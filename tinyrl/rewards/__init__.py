"""Verifiers and reward functions (TRL signature), and the weighted reward set of a run.

`REWARDS` names every library reward; its module (math.py, format.py, code.py, qa.py,
trl_compat.py) loads when a run uses it.
"""

from tinyrl.rewards.core import REWARDS, RewardSet, register, resolve_reward, score_rollouts

__all__ = ["REWARDS", "RewardSet", "register", "resolve_reward", "score_rollouts"]
