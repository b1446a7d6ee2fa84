"""How far an update moved the policy on the rows it trained on, measured with the loss's own rule.

`update_movement(old, new, advantages, mask, s)` takes the logprobs of the sampled tokens before and
after the optimiser step(s) and returns token-weighted means (value, weight), so ranks can combine them:

- `update_kl`: KL(old || new), k3 per token (the tokens were sampled before the update);
- `update_clip_frac`: the share of tokens whose importance ratio left the clip range in the direction
  the clip binds (ratio > 1 + epsilon_high with A > 0, ratio < 1 - epsilon_low with A < 0), the ratio
  taken at `s.ratio_level` exactly as `policy_loss` takes it: per token, or per sequence under GSPO
  (whose epsilons, ~3e-4, bound a sequence's mean log-ratio, not a token's);
- for the responses with positive advantage: `logp_pos_mean` (their mean token logprob before),
  `logp_pos_delta` (the change of their total log-likelihood, per token) and `frac_pos_delta_nonpos`
  (the share whose likelihood did not rise: lazy likelihood displacement).
"""

from __future__ import annotations

import torch

from tinyrl.algo.losses import LossSwitches, importance_log_ratio, kl_penalty


@torch.no_grad()
def update_movement(old: torch.Tensor, new: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                    s: LossSwitches) -> dict[str, tuple[float, float]]:
    """`old`, `new`: [N, T] logprobs of the sampled tokens; `advantages`: [N] or [N, T]; `mask`: [N, T].

    >>> s = type("S", (), {"ratio_level": "sequence", "epsilon_low": 0.1, "epsilon_high": 0.1})()
    >>> old, new = torch.zeros(1, 2), torch.tensor([[0.15, -0.15]])  # each token's ratio outside 1 +- 0.1
    >>> update_movement(old, new, torch.ones(1), torch.ones(1, 2), s)["update_clip_frac"]  # the sequence's is 1
    (0.0, 2.0)
    """
    m = mask.float()
    n = m.sum().clamp(min=1)
    log_r = (new - old) * m
    adv_tok = advantages if advantages.dim() == 2 else advantages[:, None].expand_as(m)
    ratio = torch.exp(importance_log_ratio(new, old, m, s.ratio_level)).expand_as(m)
    out_of_range = ((ratio > 1 + s.epsilon_high) & (adv_tok > 0)) | ((ratio < 1 - s.epsilon_low) & (adv_tok < 0))
    weight = float(m.sum())
    out = {"update_kl": (float((kl_penalty(old, new) * m).sum() / n), weight),
           "update_clip_frac": (float((out_of_range * m).sum() / n), weight)}
    adv_row = advantages if advantages.dim() == 1 else (advantages * m).sum(-1) / m.sum(-1).clamp(min=1)
    pos = adv_row > 0
    if pos.any():
        mp = m[pos]
        delta = log_r[pos].sum(-1)  # per response, change of its total log-likelihood
        w = float(mp.sum())
        out.update({"logp_pos_mean": (float((old[pos] * mp).sum() / mp.sum().clamp(min=1)), w),
                    "logp_pos_delta": (float(delta.sum() / mp.sum().clamp(min=1)), w),  # per token
                    "frac_pos_delta_nonpos": (float((delta <= 0).float().mean()), float(pos.sum()))})
    return out
