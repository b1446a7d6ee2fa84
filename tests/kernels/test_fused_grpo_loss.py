"""fused_linear_grpo_loss vs the naive composition: full logits -> log_softmax -> gather -> policy_loss."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import TOL, assert_three_way, max_err, tol_of

import tinyrl.kernels as K
from tinyrl.algo.losses import BatchTotals, policy_loss
from tinyrl.config import AlgoConfig
from tinyrl.kernels.torch_logprobs import naive_linear_logprobs

N, T, H, V = 4, 6, 16, 120


def make_batch(dtype=torch.float64, device="cpu", bias=False):
    """A batch where clipping is active on both sides, TIS truncates, and masks have holes."""
    h = torch.randn(N, T, H, dtype=torch.float64) / math.sqrt(H) * 3
    w = torch.randn(V, H, dtype=torch.float64)
    b = torch.randn(V, dtype=torch.float64) * 0.5 if bias else None
    t = torch.randint(0, V, (N, T))
    lens = torch.tensor([T, T - 2, 3, 1])
    mask = (torch.arange(T)[None, :] < lens[:, None]).double()
    mask[0, 2] = 0.0  # a masked-out tool-output token inside a completion
    with torch.no_grad():
        lp, _ = naive_linear_logprobs(h.reshape(-1, H), w, t.reshape(-1), bias=b, temperature=0.8)
    lp = lp.reshape(N, T)
    old = lp + (torch.rand(N, T, dtype=torch.float64) - 0.5) * 1.4  # ratio in ~[0.5, 2]
    # keep every ratio clear of the clip edges of `settings()`: a low-precision logprob must not
    # move a token across an edge (its gradient switches on or off there, a jump no tolerance covers)
    for edge in (math.log(1 - EPS_LOW), math.log(1 + EPS_HIGH)):
        gap = (lp - old) - edge
        old = torch.where(gap.abs() < 0.08, old - 0.16 * torch.where(gap >= 0, 1.0, -1.0), old)
    old[0, 0], old[1, 0] = lp[0, 0] - 0.7, lp[1, 0] + 0.7  # sure clips: ratio 2 at A > 0, 0.5 at A < 0
    ref = lp + torch.randn(N, T, dtype=torch.float64) * 0.3
    roll = old + torch.randn(N, T, dtype=torch.float64) * 0.4
    adv = torch.tensor([1.0, -1.0, 0.5, -0.3], dtype=torch.float64) * (1 + torch.rand(N, dtype=torch.float64))
    cast = lambda x: None if x is None else x.to(device=device, dtype=dtype)  # noqa: E731
    return dict(h=cast(h), w=cast(w), b=cast(b), t=t.to(device), mask=mask.to(device), adv=adv.to(device),
                old=old.to(device), ref=ref.to(device), roll=roll.to(device))


EPS_LOW, EPS_HIGH = 0.2, 0.28


def settings(agg="token_mean", kl=False, tis=False, **kw) -> AlgoConfig:
    return AlgoConfig(epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH, loss_agg=agg, beta=0.05 if kl else 0.0,
                      tis="token" if tis else "none", tis_cap=1.2, **kw)


def naive_loss(d, s, temperature=0.8, totals=None, upcast=True):
    """The obvious implementation: materialise [N*T, V] logits, then algo's policy_loss."""
    h = d["h"].detach().requires_grad_()
    w = d["w"].detach().requires_grad_()
    logp, ent = naive_linear_logprobs(h.reshape(-1, H), w, d["t"].reshape(-1), bias=d["b"],
                                      temperature=temperature, upcast=upcast)
    logp, ent = logp.reshape(N, T), ent.reshape(N, T)
    dt = logp.dtype
    out = policy_loss(logp, d["old"].to(dt), d["adv"].to(dt), d["mask"].to(dt), s, totals=totals,
                      ref_logp=d["ref"].to(dt), rollout_logp=d["roll"].to(dt))
    out.loss.backward()
    m = d["mask"].to(dt)
    stats = dict(out.stats, entropy=float((ent * m).sum() / m.sum()))
    return out.loss.detach(), logp.detach() * m, ent * m, h.grad, w.grad, stats


def fused_loss(d, s, impl, temperature=0.8, totals=None, chunk_size=5):
    h = d["h"].detach().requires_grad_()
    w = d["w"].detach().requires_grad_()
    out = K.fused_linear_grpo_loss(h, w, d["t"], d["mask"], d["adv"], s, bias=d["b"], old_logp=d["old"],
                                   ref_logp=d["ref"], rollout_logp=d["roll"], totals=totals,
                                   temperature=temperature, chunk_size=chunk_size, impl=impl)
    out.loss.backward()
    assert not out.entropy.requires_grad
    return out.loss.detach(), out.logprobs.detach(), out.entropy, h.grad, w.grad, out.stats


NAMES = ("loss", "logprobs", "entropy", "grad_hidden", "grad_weight")
STAT_KEYS = ("pg_loss", "clip_frac_low", "clip_frac_high", "clip_frac", "pass_kl", "entropy")


def compare(got, gold, dtype, kl):
    for name, a, b in zip(NAMES, got[:5], gold[:5]):
        assert max_err(a.cpu(), b.cpu()) <= tol_of(dtype, b), name
    for k in STAT_KEYS + ("ref_kl",):  # ref_logp is always given: ref_kl is measured, in the loss or not
        assert got[5][k] == pytest.approx(gold[5][k], abs=TOL[dtype] * 10, rel=TOL[dtype] * 10), k


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean", "constant"])
@pytest.mark.parametrize("kl", [False, True])
@pytest.mark.parametrize("tis", [False, True])
def test_torch_matches_naive_fp64(agg, kl, tis):
    d = make_batch(bias=tis)  # the bias is exercised with half the cases
    s = settings(agg, kl, tis)
    gold = naive_loss(d, s)
    assert gold[5]["clip_frac_low"] > 0 and gold[5]["clip_frac_high"] > 0  # both clip sides active
    compare(fused_loss(d, s, "torch"), gold, torch.float64, kl)


@pytest.mark.parametrize("agg,kl,tis", [("token_mean", True, True), ("seq_mean", False, True),
                                        ("constant", True, False), ("token_mean", False, False)])
def test_triton_matches_naive(triton_device, agg, kl, tis):
    d = make_batch(torch.float32, triton_device, bias=kl)
    gold = naive_loss(make_batch_like(d, torch.float64), settings(agg, kl, tis))
    compare(fused_loss(d, settings(agg, kl, tis), "triton"), gold, torch.float32, kl)


def make_batch_like(d, dtype):
    return {k: (v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in d.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_three_way(request, dtype, impl):
    device = request.getfixturevalue("triton_device") if impl == "triton" else "cpu"
    d = make_batch(dtype, device, bias=True)
    s = settings("token_mean", kl=True, tis=True)
    gold = naive_loss(make_batch_like(d, torch.float64), s)
    ref = naive_loss(d, s, upcast=False)  # torch in the input dtype, logits included
    got = fused_loss(d, s, impl)
    for name, a, r, g in zip(NAMES, got[:5], ref[:5], gold[:5]):
        assert_three_way(name, a.cpu().reshape(g.shape), r.cpu(), g.cpu(), dtype)


def test_micro_batches_add_up_to_the_batch():
    """With the batch's BatchTotals, micro-batch losses and gradients sum to the full-batch ones."""
    d = make_batch()
    s = settings("seq_mean", kl=True)
    totals = BatchTotals.of(d["mask"])
    full = fused_loss(d, s, "torch", totals=totals)
    parts = []
    for rows in (slice(0, 2), slice(2, 4)):
        part = {k: (v[rows] if torch.is_tensor(v) and k not in ("w", "b") else v) for k, v in d.items()}
        h = part["h"].detach().requires_grad_()
        w = part["w"].detach().requires_grad_()
        out = K.fused_linear_grpo_loss(h, w, part["t"], part["mask"], part["adv"], s, old_logp=part["old"],
                                       ref_logp=part["ref"], totals=totals, temperature=0.8, impl="torch")
        out.loss.backward()
        parts.append((out.loss.detach(), h.grad, w.grad))
    assert float(parts[0][0] + parts[1][0]) == pytest.approx(float(full[0]), rel=1e-10)
    assert max_err(torch.cat([parts[0][1], parts[1][1]]), full[3]) < 1e-10
    assert max_err(parts[0][2] + parts[1][2], full[4]) < 1e-10


def test_other_settings_pass_through():
    """GSPO sequence ratios, sequence TIS, dual clip, LLDS: same as the naive path."""
    d = make_batch(bias=True)
    s = AlgoConfig(ratio_level="sequence", tis="sequence", tis_mode="mask", tis_cap=2.0, dual_clip=3.0,
                   llds_lambda=0.1, beta=0.02, epsilon_high=0.28)
    gold = naive_loss(d, s)
    got = fused_loss(d, s, "torch")
    compare(got, gold, torch.float64, kl=True)
    assert got[5]["llds"] == pytest.approx(gold[5]["llds"], rel=1e-9, abs=1e-12)


def test_default_old_logp_is_the_detached_current_policy():
    """old_logp=None: ratio 1 everywhere, so no clipping and the gradient is -A * grad logp / count."""
    d = make_batch()
    s = settings("token_mean")
    h = d["h"].detach().requires_grad_()
    out = K.fused_linear_grpo_loss(h, d["w"], d["t"], d["mask"], d["adv"], s, temperature=0.8, impl="torch")
    out.loss.backward()
    assert out.stats["clip_frac"] == 0.0 and "pass_kl" not in out.stats  # no old policy given: nothing measured
    h2 = d["h"].detach().requires_grad_()
    logp, _ = naive_linear_logprobs(h2.reshape(-1, H), d["w"], d["t"].reshape(-1), temperature=0.8)
    surrogate = -(logp.reshape(N, T) * d["adv"][:, None] * d["mask"]).sum() / d["mask"].sum()
    surrogate.backward()
    assert max_err(h.grad, h2.grad) < 1e-10
    assert float(out.loss.detach()) == pytest.approx(float(-(d["adv"][:, None] * d["mask"]).sum() / d["mask"].sum()))
