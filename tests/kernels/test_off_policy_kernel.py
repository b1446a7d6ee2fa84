"""algo.off_policy through the fused Triton loss (under TRITON_INTERPRET on a CPU, see conftest.py): bypass
and decoupled reach the kernel as its own inputs (old_logp, rollout_logp, switches) and agree with torch."""

from __future__ import annotations

import pytest
import torch

import tinyrl.kernels as K
from tinyrl.algo.losses import off_policy_inputs
from tinyrl.config import AlgoConfig


@pytest.mark.parametrize("mode", ["bypass", "decoupled"])
def test_the_triton_loss_agrees_with_torch(triton_device, mode):
    dev = triton_device
    N, T, H, V = 3, 5, 16, 64
    h = (torch.randn(N, T, H) / 2).to(dev)
    w = torch.randn(V, H).to(dev)
    t = torch.randint(0, V, (N, T)).to(dev)
    mask = torch.ones(N, T, device=dev)
    mask[0, 1] = 0
    adv = torch.tensor([1.0, -0.5, 0.3], device=dev)
    with torch.no_grad():
        cur, _ = K.linear_logprobs(h, w, t, impl="torch")
    prox = cur + (torch.rand(N, T, device=dev) - 0.5) * 0.6
    behav = prox + (torch.rand(N, T, device=dev) - 0.5) * 3
    s = AlgoConfig(off_policy=mode, off_policy_cap=1.8)
    outs = {}
    for impl in ("torch", "triton"):
        hh = h.clone().requires_grad_()
        x = off_policy_inputs(s, prox, behav)
        out = K.fused_linear_grpo_loss(hh, w, t, mask, adv, x.switches, old_logp=x.old_logp,
                                       rollout_logp=x.rollout_logp, impl=impl)
        out.loss.backward()
        outs[impl] = (out.loss.detach(), hh.grad)
    assert torch.allclose(outs["torch"][0], outs["triton"][0], atol=2e-5, rtol=1e-4)
    assert torch.allclose(outs["torch"][1], outs["triton"][1], atol=2e-5, rtol=1e-4)
    assert outs["torch"][1].abs().sum() > 0
