"""Rollout engines behind one interface (`RolloutEngine`: tinyrl/rollout/engine.py; the batch type
`Rollouts`: tinyrl/rollout/base.py): hf (CPU, fallback), vllm (colocated), and the multi-turn agent loop on
top of either. `tinyrl.rollout.engines` builds the one a run config names. This __init__ imports the types only."""

from tinyrl.rollout.base import Rollouts, SamplingParams
from tinyrl.rollout.engine import RolloutEngine

__all__ = ["RolloutEngine", "Rollouts", "SamplingParams"]
