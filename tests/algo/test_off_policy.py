"""algo.off_policy: tis (today's loss, unchanged), bypass (behaviour = old policy), decoupled (AReaL's
decoupled PPO), the behaviour weights' statistics and tiny end-to-end runs (the Triton path:
tests/kernels/test_off_policy_kernel.py, under the kernels' interpreter set-up)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tinyrl.algo.losses import OFF_POLICY, BatchTotals, off_policy_inputs, offpolicy_stats, policy_loss
from tinyrl.config import AlgoConfig


def loss_and_grad(logp0: torch.Tensor, adv, mask, s, proximal, behaviour):
    """The loss of `s.off_policy` and its gradient with respect to the current logprobs."""
    logp = logp0.clone().requires_grad_()
    x = off_policy_inputs(s, proximal, behaviour)
    out = policy_loss(logp, x.old_logp, adv, mask, x.switches, totals=BatchTotals.of(mask), rollout_logp=x.rollout_logp)
    out.loss.backward()
    return out, logp.grad


def batch(seed=0, N=3, T=5):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(N, T, generator=g, dtype=torch.float64) * 2
    prox = logp + (torch.rand(N, T, generator=g, dtype=torch.float64) - 0.5) * 0.8
    behav = prox + (torch.rand(N, T, generator=g, dtype=torch.float64) - 0.5) * 3
    mask = torch.ones(N, T, dtype=torch.float64)
    mask[0, 1] = 0  # a tool observation inside a completion: behaviour logprob 0, outside the loss
    behav[0, 1] = 0.0
    mask[2, 3:] = 0
    adv = torch.tensor([1.0, -0.7, 0.4], dtype=torch.float64)
    return logp, prox, behav, mask, adv


@pytest.mark.parametrize("tis", ["none", "token", "sequence"])
@pytest.mark.parametrize("later_pass", [False, True])
def test_tis_mode_is_todays_loss_bit_for_bit(tis, later_pass):
    logp, prox, behav, mask, adv = batch()
    s = AlgoConfig(tis=tis, tis_cap=1.5, dual_clip=3.0)
    assert s.off_policy == "auto"  # the default; a bare AlgoConfig's auto is the synchronous loss, tis
    old = prox if later_pass else None
    got, g_got = loss_and_grad(logp, adv, mask, s, old, behav)
    # today's call (update.py before off_policy): old_logp as given, rollout_logp only when tis is on
    ref_logp = logp.clone().requires_grad_()
    ref = policy_loss(ref_logp, old, adv, mask, s, totals=BatchTotals.of(mask),
                      rollout_logp=behav if tis != "none" else None)
    ref.loss.backward()
    assert torch.equal(got.loss, ref.loss) and torch.equal(g_got, ref_logp.grad) and got.stats == ref.stats


@pytest.mark.parametrize("later_pass", [False, True])
def test_bypass_is_the_on_policy_loss_when_nothing_is_stale(later_pass):
    logp, prox, _, mask, adv = batch(1)
    # behaviour == current: on a first pass this is the on-policy loss; a later pass's proximal is ignored
    got, g_got = loss_and_grad(logp, adv, mask, AlgoConfig(off_policy="bypass", tis="token"),
                               prox if later_pass else None, logp)
    want, g_want = loss_and_grad(logp, adv, mask, AlgoConfig(tis="none"), None, logp)
    assert torch.equal(got.loss, want.loss) and torch.equal(g_got, g_want)
    assert float(got.loss.detach()) != 0.0 and g_got.abs().sum() > 0


def test_bypass_clips_the_ratio_to_the_behaviour_policy():
    """pi = 0.5 on both tokens; behaviour 0.25 and 0.5: ratios 2 (clipped at 1.28 for A > 0) and 1."""
    logp = torch.log(torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    behav = torch.log(torch.tensor([[0.25, 0.5]], dtype=torch.float64))
    mask, adv = torch.ones(1, 2, dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    s = AlgoConfig(off_policy="bypass", epsilon_low=0.2, epsilon_high=0.28)
    out, grad = loss_and_grad(logp, adv, mask, s, None, behav)
    assert float(out.loss.detach()) == pytest.approx(-(1.28 + 1.0) / 2)
    # d/dlogp of -r A / n: the clipped token 0, the other -r / n = -0.5
    assert grad[0].tolist() == pytest.approx([0.0, -0.5])
    assert out.stats["clip_frac_high"] == pytest.approx(0.5)
    on_policy, _ = loss_and_grad(logp, adv, mask, AlgoConfig(), None, behav)  # tis mode: ratio 1, no weight
    assert float(on_policy.loss.detach()) == pytest.approx(-1.0)


def test_decoupled_weight_is_pi_prox_over_pi_behav_masked_above_the_cap():
    """Three tokens, w = 0.5, 2 and 8 (cap 5: masked, weight 0, still counted in the normaliser)."""
    prox = torch.tensor([[-1.0, -1.0, -1.0]], dtype=torch.float64)
    behav = prox - torch.log(torch.tensor([[0.5, 2.0, 8.0]], dtype=torch.float64))
    mask, adv = torch.ones(1, 3, dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    s = AlgoConfig(off_policy="decoupled", off_policy_cap=5.0, tis="none", epsilon_high=0.28)
    # first pass: the proximal policy is the current one (ratio 1)
    out, grad = loss_and_grad(prox, adv, mask, s, None, behav)
    assert float(out.loss.detach()) == pytest.approx(-(0.5 + 2.0 + 0.0) / 3)
    assert grad[0].tolist() == pytest.approx([-0.5 / 3, -2.0 / 3, 0.0])
    # a later pass: pi moved; the clip is on pi / pi_prox, the weight still pi_prox / pi_behav
    logp = prox + torch.log(torch.tensor([[1.1, 1.5, 1.1]], dtype=torch.float64))  # ratios 1.1, 1.5 (clipped), 1.1
    out, grad = loss_and_grad(logp, adv, mask, s, prox, behav)
    assert float(out.loss.detach()) == pytest.approx(-(0.5 * 1.1 + 2.0 * 1.28) / 3)
    assert grad[0].tolist() == pytest.approx([-0.5 * 1.1 / 3, 0.0, 0.0])


def test_decoupled_follows_areal_on_a_random_batch():
    """AReaL's formula (areal/utils/functional.py ppo_actor_loss_fn), written out: token mean of
    w * max(-A r, -A clip(r)) with w = exp(prox - behav), w > cap -> 0, ratio against prox."""
    logp, prox, behav, mask, adv = batch(2)
    s = AlgoConfig(off_policy="decoupled", off_policy_cap=2.0, epsilon_low=0.2, epsilon_high=0.2)
    out, grad = loss_and_grad(logp, adv, mask, s, prox, behav)
    lp = logp.clone().requires_grad_()
    r = torch.exp(lp - prox)
    a = adv[:, None]
    pg = torch.maximum(-a * r, -a * r.clamp(0.8, 1.2))
    w = torch.exp(prox - behav)
    w = torch.where(w <= 2.0, w, torch.zeros_like(w))
    want = (pg * w * mask).sum() / mask.sum()
    want.backward()
    assert float(out.loss.detach()) == pytest.approx(float(want.detach())) and torch.allclose(grad, lp.grad)
    assert (torch.exp(prox - behav)[mask.bool()] > 2.0).any()  # the cap is exercised


def test_offpolicy_stats_on_a_hand_case():
    old = torch.tensor([[0.0, -1.0, -1.0, -3.0]])
    behav = torch.tensor([[0.0, -1.0 - math.log(2.0), -1.0 + math.log(2.0), 0.0]])  # w = 1, 2, 0.5; obs token
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the observation (behaviour logprob 0) is outside the loss
    st = offpolicy_stats(old, behav, mask, cap=1.5)
    assert st["offpolicy_ess"] == pytest.approx(3.5 ** 2 / (3 * 5.25))
    assert st["offpolicy_capped_frac"] == pytest.approx(1 / 3)
    assert offpolicy_stats(old, old, mask, cap=1.5) == {"offpolicy_ess": 1.0, "offpolicy_capped_frac": 0.0}
    assert offpolicy_stats(old, behav, torch.zeros(1, 4), cap=1.5) == {}


def test_the_reference_cap_of_each_mode():
    caps = {m: OFF_POLICY[m].cap(AlgoConfig(off_policy=m, tis_cap=3.0, off_policy_cap=6.0)) for m in OFF_POLICY}
    assert caps == {"tis": 6.0, "bypass": 6.0, "decoupled": 6.0}
    assert OFF_POLICY["tis"].cap(AlgoConfig(tis="token", tis_cap=3.0, off_policy_cap=6.0)) == 3.0


# --------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("mode,iterations", [("bypass", 1), ("decoupled", 2)])
def test_a_tiny_run_trains_and_reports_the_weight_statistics(tiny_model_dir, run_root, mode, iterations):
    from tinyrl.api import train

    run = train(**{"model.name": tiny_model_dir, "log.run_dir": run_root, "log.progress": False,
                   "train.steps": 2, "train.prompts_per_step": 4, "rollout.num_generations": 4,
                   "train.micro_batch_size": 8, "rollout.max_new_tokens": 4, "data.num_train": 64,
                   "data.num_eval": 0, "train.lr": 1e-2, "train.eval_before_after": False,
                   "reward.functions": ["tests.test_training:reward_by_length"],
                   "algo.off_policy": mode, "algo.num_iterations": iterations})
    rows = [json.loads(x) for x in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # synchronous sampling: behaviour == trainer up to numerics, so the weights are ~1 and none capped
        assert 0.99 < r["offpolicy_ess"] <= 1.0 + 1e-9 and r["offpolicy_capped_frac"] == 0.0
        assert math.isfinite(r["loss"]) and r["grad_norm"] > 0
        assert r["train_groups"] == 4


def test_the_update_routes_each_mode_to_its_loss(tiny_model_dir, run_root):
    """policy_update on one real batch whose behaviour logprobs were perturbed (as if sampled by older
    weights): decoupled is token-level TIS in mask mode at off_policy_cap; bypass anchors the clip to the
    behaviour policy (equal to the on-policy update when the behaviour logprobs are the trainer's own)."""
    from dataclasses import replace

    from tinyrl.api import build_trainer
    from tinyrl.update import policy_update

    t = build_trainer(overrides={
        "model.name": tiny_model_dir, "log.run_dir": run_root, "log.progress": False, "train.steps": 1,
        "train.prompts_per_step": 4, "rollout.num_generations": 4, "train.micro_batch_size": 8,
        "rollout.max_new_tokens": 6, "data.num_train": 64, "data.num_eval": 0, "train.lr": 1e-2,
        "train.eval_before_after": False, "reward.functions": ["tests.test_training:reward_by_length"]})
    batch, _ = t.collect_batch()
    t.advantages(batch)
    on_policy = batch.sampling_logprobs.clone()
    g = torch.Generator().manual_seed(0)
    stale = on_policy + (torch.rand(on_policy.shape, generator=g) - 0.5) * 2.0 * batch.loss_mask

    def grads(behaviour, **algo):
        batch.sampling_logprobs = behaviour
        lr = t.optimizer.param_groups[0]["lr"]
        t.optimizer.param_groups[0]["lr"] = 0.0  # the gradient only; the weights stay
        res = policy_update(t.model, t.optimizer, batch, replace(t.cfg.algo, **algo), temperature=1.0,
                            micro_batch=8, max_grad_norm=1e9, max_len=6)
        t.optimizer.param_groups[0]["lr"] = lr
        return res, torch.cat([p.grad.flatten() for p in t.model.parameters() if p.grad is not None])

    dec, g_dec = grads(stale, off_policy="decoupled", off_policy_cap=1.5, tis="none")
    tis, g_tis = grads(stale, off_policy="tis", tis="token", tis_mode="mask", tis_cap=1.5)
    assert dec.offpolicy_cap == 1.5 and torch.equal(g_dec, g_tis) and dec.stats["loss"] == tis.stats["loss"]
    _, g_plain = grads(stale, off_policy="tis", tis="none")
    assert not torch.allclose(g_dec, g_plain)  # the weights acted
    trainer_logp = grads(stale, tis="none")[0].logprobs  # the first pass's logprobs: pi at the step's start
    _, g_bypass_fresh = grads(trainer_logp, off_policy="bypass")
    assert torch.allclose(g_bypass_fresh, g_plain, rtol=1e-5, atol=1e-8)
    _, g_bypass_stale = grads(stale, off_policy="bypass")
    assert not torch.allclose(g_bypass_stale, g_plain, rtol=1e-3, atol=1e-6)


def test_auto_is_decoupled_when_batches_mix_policy_versions():
    from tinyrl.config import resolve

    assert resolve("tiny_grpo_cpu", decide_auto=False).cfg.algo.off_policy == "tis"
    assert resolve("tiny_grpo_cpu", overrides={"rollout.max_staleness": 1}).cfg.algo.off_policy == "decoupled"
    assert resolve("tiny_grpo_cpu", overrides={"rollout.max_staleness": 1, "algo.off_policy": "bypass"}
                   ).cfg.algo.off_policy == "bypass"
    written = resolve("tiny_grpo_cpu", overrides={"rollout.max_staleness": 1}).written
    assert written["algo"]["off_policy"] == "auto"  # config.yaml keeps the choice, each run decides it
