"""Verifiers and reward functions (TRL signature), and the weighted reward set of a run."""

from tinyrl.rewards.core import REWARDS, RewardSet, register, resolve_reward, score_rollouts

__all__ = ["REWARDS", "RewardSet", "register", "resolve_reward", "score_rollouts"]

# Library rewards register themselves on import (all light: math-verify, TRL load lazily).
from tinyrl.rewards import math  # noqa: E402,F401
from tinyrl.rewards import format  # noqa: E402,F401
from tinyrl.rewards import code  # noqa: E402,F401
from tinyrl.rewards import trl_compat  # noqa: E402,F401
from tinyrl.rewards import qa  # noqa: E402,F401
