"""Advantage estimators and policy losses of the GRPO family: pure math on tensors."""

from tinyrl.algo.advantages import ESTIMATORS, AdvantageInputs, AdvantageOutput
from tinyrl.algo.losses import AGGREGATIONS, BatchTotals, LossOutput, LossSwitches, kl_penalty, policy_loss
from tinyrl.algo.recipes import RECIPES

__all__ = ["ESTIMATORS", "AGGREGATIONS", "RECIPES", "AdvantageInputs", "AdvantageOutput",
           "BatchTotals", "LossOutput", "LossSwitches", "kl_penalty", "policy_loss"]
