"""How far an update moved the policy (tinyrl.algo.movement), measured by the loss's own ratio rule: under GSPO
the clip fraction is the share of sequences whose mean log-ratio left GSPO's bounds, not of tokens (the
trainer used to count token ratios against GSPO's sequence bounds, ~3e-4, whatever algo.ratio_level said)."""

from __future__ import annotations

import pytest
import torch

from tinyrl.algo.losses import policy_loss
from tinyrl.algo.movement import update_movement
from tinyrl.api import build_trainer
from tinyrl.config import RunConfig


def switches(level, lo=0.2, hi=0.2):
    algo = RunConfig().algo
    algo.ratio_level, algo.epsilon_low, algo.epsilon_high = level, lo, hi
    return algo


def test_by_hand_token_and_sequence_level():
    old = torch.zeros(2, 3)
    new = torch.tensor([[0.3, -0.3, 0.0], [0.3, 0.3, 0.3]])  # row 0: mean 0; row 1: mean 0.3
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    tok = update_movement(old, new, adv, mask, switches("token"))
    # tokens: row 0's first (e^0.3 > 1.2, A > 0) is clipped; row 1 has A < 0 and ratios > 1: never clipped
    assert tok["update_clip_frac"] == (pytest.approx(1 / 5), 5.0)
    seq = update_movement(old, new, torch.tensor([1.0, 1.0]), mask, switches("sequence"))
    # sequences: row 0's mean log-ratio is 0 (ratio 1); row 1's is 0.3 (e^0.3 > 1.2, A > 0): its 2 tokens
    assert seq["update_clip_frac"] == (pytest.approx(2 / 5), 5.0)
    k3 = torch.exp(new - old) - (new - old) - 1  # KL(old || new) per token, k3 of log(new / old)
    assert tok["update_kl"][0] == pytest.approx(float((k3 * mask).sum() / 5))


def test_the_clip_fraction_agrees_with_the_losses_own_clip_statistics():
    g = torch.Generator().manual_seed(0)
    old = torch.randn(6, 5, generator=g) * 0.1
    new = old + torch.randn(6, 5, generator=g) * 0.3
    mask, adv = torch.ones(6, 5), torch.randn(6, generator=g)
    for level in ("token", "sequence"):
        s = switches(level, 0.1, 0.15)
        out = policy_loss(new, old, adv, mask, s)  # the loss's clip_frac: the same rule, the same ratio level
        assert update_movement(old, new, adv, mask, s)["update_clip_frac"][0] == pytest.approx(out.stats["clip_frac"])


def test_the_trainer_measures_gspo_updates_at_the_sequence_level(tiny_model_dir, run_root):
    t = build_trainer(overrides={"model.name": tiny_model_dir, "log.run_dir": run_root, "log.progress": False,
                                 "algo.recipe": "gspo", "train.prompts_per_step": 2, "rollout.num_generations": 4, "train.micro_batch_size": 8,
                                 "rollout.max_new_tokens": 6, "data.num_eval": 0, "train.eval_before_after": False,
                                 "reward.functions": ["tests.test_training:reward_by_length"]})
    try:
        batch, _ = t.collect_batch()
        t.advantages(batch)
        first, _ = t.update(batch)
        m = batch.loss_mask.float()
        wiggle = torch.linspace(-1, 1, m.shape[1]).expand_as(m) * 0.05 * m  # token ratios far outside 1 +- 4e-4 ...
        wiggle = wiggle - (wiggle.sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)) * m  # ... mean 0
        moved = first.logprobs + wiggle

        class Scored:
            logprobs = moved

        t._score = lambda *a, **kw: Scored
        assert t.measure_update(batch, first)["update_clip_frac"] == 0.0  # each sequence's ratio is 1
        t.state.config_patches["algo.ratio_level"] = "token"  # the same movement, counted per token
        assert t.measure_update(batch, first)["update_clip_frac"] > 0.2
    finally:
        t.run.unlock()
