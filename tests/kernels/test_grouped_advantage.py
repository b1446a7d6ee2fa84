"""grouped_advantages: the Triton kernel vs tinyrl.algo.advantages.grpo (the reference), fp64 gold."""

from __future__ import annotations

import math

import pytest
import torch

import tinyrl.kernels as K
from tinyrl.algo.advantages import AdvantageInputs, dr_grpo, grpo
from tinyrl.kernels.grouped_advantage import torch_grouped_advantages, triton_grouped_advantages


def make_rewards(n_groups=9, G=5, dtype=torch.float32):
    """Shuffled group ids, 0/1 and graded rewards, NaNs, an all-equal group, a singleton group,
    an all-NaN group and an id with no rows at all."""
    group = torch.arange(n_groups).repeat_interleave(G)
    r = torch.where(torch.rand(n_groups * G) < 0.5, torch.randint(0, 2, (n_groups * G,)).float(),
                    torch.rand(n_groups * G))
    r[group == 0] = 0.75  # all equal: std 0
    r[(group == 1)] = float("nan")  # all failed: no stats
    r[(group == 2) & (torch.arange(n_groups * G) % G != 0)] = float("nan")  # one valid reward
    r[(torch.rand(n_groups * G) < 0.1) & (group != 0)] = float("nan")  # group 0 keeps >= 2 valid rewards
    group = torch.where(group == 3, torch.full_like(group, n_groups), group)  # id 3 unused
    perm = torch.randperm(len(r))
    return r[perm].to(dtype), group[perm]


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("n_groups,G", [(9, 5), (70, 23)])  # the second spans several row and group tiles
def test_triton_three_way(triton_device, scale, n_groups, G):
    r, g = make_rewards(n_groups, G)
    gold, gold_stats = torch_grouped_advantages(r.double(), g, scale)
    ref, ref_stats = torch_grouped_advantages(r, g, scale)
    got, stats = triton_grouped_advantages(r.to(triton_device), g.to(triton_device), scale)
    got = got.cpu()
    assert got.dtype == r.dtype and got.shape == r.shape
    assert (got[torch.isnan(r)] == 0).all()
    e_k = float((got.double() - gold).abs().max())
    e_t = float((ref.double() - gold).abs().max())
    assert e_k <= max(2e-6 * max(1.0, float(gold.abs().max())), 2 * e_t), (e_k, e_t)
    assert stats["zero_std_frac"] == pytest.approx(gold_stats["zero_std_frac"], abs=1e-7)
    assert stats["group_std_mean"] == pytest.approx(gold_stats["group_std_mean"], rel=1e-6)
    assert stats["zero_std_frac"] > 0  # the all-equal group is counted


def test_hand_computed():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, float("nan"), 2.0])
    g = torch.tensor([0, 0, 1, 1, 2, 2])
    adv, stats = K.grouped_advantages(r, g, scale="none", impl="torch")
    assert torch.allclose(adv, torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0]))
    adv, stats = K.grouped_advantages(r, g, scale="group", impl="torch")
    std = math.sqrt(0.5)  # unbiased std of {0, 1}; group 2 has one valid reward: std 0 -> adv 0
    assert torch.allclose(adv, torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0]) / (std + 1e-4) * torch.tensor(
        [1, 1, 1, 1, 0, 0.0]))
    assert stats == {"zero_std_frac": 0.0, "group_std_mean": pytest.approx(std)}


def test_torch_impl_is_the_algo_reference():
    r, g = make_rewards()
    for scale in ("group", "batch", "none"):
        adv, stats = K.grouped_advantages(r, g, scale=scale, eps=1e-3, impl="auto")  # CPU: torch
        out = grpo(AdvantageInputs(r, g, scale=scale, eps=1e-3))
        assert torch.equal(adv, out.advantages)
        assert stats == {"zero_std_frac": out.zero_std_frac, "group_std_mean": out.group_std_mean}
    assert torch.equal(K.grouped_advantages(r, g, scale="none")[0], dr_grpo(AdvantageInputs(r, g)).advantages)


def test_triton_hand_computed_and_edge_cases(triton_device):
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, float("nan"), 2.0], device=triton_device)
    g = torch.tensor([0, 0, 1, 1, 2, 2], device=triton_device)
    adv, stats = triton_grouped_advantages(r, g, "group", eps=1e-4)
    std = math.sqrt(0.5)
    want = torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0]) / (std + 1e-4)
    assert torch.allclose(adv.cpu(), want, atol=1e-6)
    assert stats["zero_std_frac"] == 0.0 and stats["group_std_mean"] == pytest.approx(std)
    adv, stats = triton_grouped_advantages(r[:1], g[:1], "group")  # one row: no group has 2 rewards
    assert adv.cpu().tolist() == [0.0] and stats == {"zero_std_frac": 0.0, "group_std_mean": 0.0}
    nan = torch.full((4,), float("nan"), device=triton_device)
    adv, _ = triton_grouped_advantages(nan, torch.zeros(4, dtype=torch.long, device=triton_device), "batch")
    assert (adv == 0).all()
    with pytest.raises(ValueError, match="scale"):
        triton_grouped_advantages(r, g, "rank")


def test_triton_all_equal_group_is_zero_std_even_in_fp64(triton_device):
    """Rewards 0.1 x 3 in fp64: the mean rounds (sum/3 != 0.1), so a std from deviations is ~1e-17.
    The kernel detects all-equal groups exactly (max == min) and gives std 0 and advantage 0.
    (The torch reference reports zero_std_frac 0 here; for fp32/bf16 rewards both agree exactly.)"""
    r = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.0], dtype=torch.float64, device=triton_device)
    g = torch.tensor([0, 0, 0, 1, 1], device=triton_device)
    adv, stats = triton_grouped_advantages(r, g, "group")
    assert adv.cpu()[:3].tolist() == [0.0, 0.0, 0.0]
    assert stats["zero_std_frac"] == 0.5
