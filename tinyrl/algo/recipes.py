"""Named recipes: each is a set of AlgoConfig switches. A run names one with `algo.recipe`
and may then override any field (precedence: tinyrl.config.resolve_recipe).

- grpo: DeepSeekMath GRPO (arXiv 2402.03300). Group-normalised advantages (r - mean)/std,
  PPO-style token ratio clipped at 0.2, each sequence's token mean averaged over sequences.
  The original adds a k3 KL to a reference; here beta stays 0 unless set (most recent work drops it).
- dr_grpo: "Understanding R1-Zero-Like Training" (Liu et al., arXiv 2503.20783). Removes the
  two length/difficulty biases of GRPO: no std division, and a constant normaliser (max
  completion length) instead of per-sequence token means.
- dapo: DAPO (Yu et al., arXiv 2503.14476). Clip-higher (eps_low 0.2, eps_high 0.28),
  token-level loss over the batch, dynamic sampling of groups with non-constant rewards,
  soft overlong punishment; no KL.
- gspo: Group Sequence Policy Optimization (Zheng et al., arXiv 2507.18071). The importance
  ratio is the sequence-level geometric mean of token ratios, clipped in a small range
  (3e-4 / 4e-4), which stabilises MoE and long-sequence training.
- rloo: REINFORCE Leave-One-Out (Ahmadian et al., arXiv 2402.14740). Each sample's baseline is
  the mean reward of the other samples of its prompt; no std scaling.
- reinforce_pp: REINFORCE++ (Hu, arXiv 2501.03262). Token rewards carry a k1 KL penalty
  (kl_in_reward: the KL is charged there, once, and not again in the loss), returns are
  whitened over the whole batch instead of per group; needs beta > 0 for the KL part.
"""

from __future__ import annotations

from typing import Any

RECIPES: dict[str, dict[str, Any]] = {
    "grpo": {"estimator": "grpo", "scale": "group", "loss_agg": "seq_mean",
             "epsilon_low": 0.2, "epsilon_high": 0.2},
    "dr_grpo": {"estimator": "dr_grpo", "scale": "none", "loss_agg": "constant"},
    "dapo": {"estimator": "grpo", "scale": "group", "loss_agg": "token_mean",
             "epsilon_low": 0.2, "epsilon_high": 0.28, "dynamic_sampling": True,
             "overlong_buffer": 16, "beta": 0.0},
    "gspo": {"estimator": "grpo", "scale": "group", "ratio_level": "sequence",
             "loss_agg": "seq_mean", "epsilon_low": 3e-4, "epsilon_high": 4e-4},
    "rloo": {"estimator": "rloo", "scale": "none", "loss_agg": "token_mean"},
    "reinforce_pp": {"estimator": "reinforce_pp", "scale": "none", "loss_agg": "token_mean",
                     "beta": 0.01, "kl_estimator": "k1", "kl_in_reward": True},
}

