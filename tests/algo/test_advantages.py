"""Each advantage estimator against a small example worked by hand."""

import math

import pytest
import torch

from tinyrl.algo.advantages import ESTIMATORS, AdvantageInputs, masked_whiten
from tinyrl.algo.shaping import informative_groups, overlong_penalty

NAN = float("nan")
# group 0: [1, 0, 0, 1] (mean 0.5, unbiased std sqrt(1/3)); group 1: [1, 1, 1, NaN] (std 0)
R = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, NAN])
G = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
S3 = math.sqrt(1 / 3)


def adv(name, **kw):
    return ESTIMATORS[name](AdvantageInputs(R, G, **kw))


def test_grpo_group_scale():
    out = adv("grpo", scale="group", eps=1e-4)
    a = 0.5 / (S3 + 1e-4)
    assert torch.allclose(out.advantages, torch.tensor([a, -a, -a, a, 0, 0, 0, 0]), atol=1e-6)
    assert out.zero_std_frac == 0.5  # group 1 is constant
    assert out.group_std_mean == pytest.approx(S3 / 2, abs=1e-6)


def test_grpo_batch_scale():
    # batch std over the 7 valid rewards: mean 5/7, unbiased var (10/7)/6
    std = math.sqrt((10 / 7) / 6)
    a = 0.5 / (std + 1e-4)
    out = adv("grpo", scale="batch", eps=1e-4)
    assert torch.allclose(out.advantages, torch.tensor([a, -a, -a, a, 0, 0, 0, 0]), atol=1e-6)


def test_grpo_no_scale_equals_dr_grpo():
    expect = torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0])
    assert torch.allclose(adv("grpo", scale="none").advantages, expect)
    assert torch.allclose(adv("dr_grpo", scale="group").advantages, expect)  # dr_grpo never divides


def test_nan_reward_gets_zero_and_is_excluded():
    out = adv("grpo")
    assert out.advantages[7] == 0 and not torch.isnan(out.advantages).any()


def test_rloo_leave_one_out():
    # r=1 in group 0: others [0, 0, 1] -> 1 - 1/3; r=0: others [1, 0, 1] -> 0 - 2/3; group 1: 1 - 1 = 0
    out = adv("rloo", scale="none")
    assert torch.allclose(out.advantages, torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0, 0, 0, 0]), atol=1e-6)


def test_reinforce_pp_baseline_whitens_over_tokens():
    mask = torch.ones(8, 2)
    out = adv("reinforce_pp_baseline", mask=mask).advantages
    # centered rows [.5, -.5, -.5, .5, 0, 0, 0, excluded] x 2 tokens: mean 0, var (8 * .25) / 13
    a = 0.5 / math.sqrt(2 / 13 + 1e-8)
    assert torch.allclose(out[0], torch.tensor([a, a]), atol=1e-5)
    assert torch.allclose(out[1], torch.tensor([-a, -a]), atol=1e-5)
    assert torch.all(out[7] == 0)


def test_reinforce_pp_returns_to_go_with_kl():
    r = torch.tensor([1.0, 0.0])
    g = torch.tensor([0, 0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    plain = ESTIMATORS["reinforce_pp"](AdvantageInputs(r, g, mask=mask)).advantages
    # returns [1, 1, -] and [0, 0, 0]: mean .4, unbiased var .3
    assert torch.allclose(plain[0, :2], torch.full((2,), 0.6 / math.sqrt(0.3)), atol=1e-5)
    assert torch.allclose(plain[1], torch.full((3,), -0.4 / math.sqrt(0.3)), atol=1e-5)
    assert plain[0, 2] == 0
    kl = torch.tensor([[0.2, 0.4, 0.0], [0.0, 0.0, 0.0]])
    out = ESTIMATORS["reinforce_pp"](AdvantageInputs(r, g, mask=mask, kl=kl, beta=0.5)).advantages
    # token rewards row 0: [-0.1, 1 - 0.2] -> returns [0.7, 0.8]; values [.7, .8, 0, 0, 0]: mean .3, var .17
    assert out[0, 0] == pytest.approx(0.4 / math.sqrt(0.17), abs=1e-5)
    assert out[0, 1] == pytest.approx(0.5 / math.sqrt(0.17), abs=1e-5)


def test_masked_whiten_ignores_masked_entries():
    v = torch.tensor([[1.0, 3.0, 100.0]])
    m = torch.tensor([[1.0, 1.0, 0.0]])
    w = masked_whiten(v, m)
    assert torch.allclose(w, torch.tensor([[-1 / math.sqrt(2), 1 / math.sqrt(2), 0.0]]), atol=1e-6)


def test_overlong_penalty_dapo():
    pen = overlong_penalty(torch.tensor([4, 12, 14, 16]), max_len=16, buffer=4, penalty=1.0)
    assert torch.allclose(pen, torch.tensor([0.0, 0.0, -0.5, -1.0]))


def test_informative_groups_drops_constant_groups():
    keep = informative_groups(R, G)
    assert keep.tolist() == [True, False]
