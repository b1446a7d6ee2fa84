"""The clipped policy loss, each aggregation, ratio level and extra term against hand values."""

import math

import pytest
import torch

from tinyrl.algo.losses import BatchTotals, kl_penalty, llds_term, policy_loss, top_entropy_mask
from tinyrl.config import AlgoConfig

LN = math.log
# row 0 (A = +1): ratios [1.5, 0.5]; row 1 (A = -1): ratios [0.7, 1.1], second token masked out
OLD = torch.zeros(2, 2)
LOGP = torch.tensor([[LN(1.5), LN(0.5)], [LN(0.7), LN(1.1)]])
ADV = torch.tensor([1.0, -1.0])
MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
# per-token pg: -min(r A, clip(r) A) with eps 0.2 / 0.28 -> [-1.28, -0.5], [0.8, (1.1)]
S = AlgoConfig(epsilon_low=0.2, epsilon_high=0.28)


def loss(settings=S, mask=MASK, logp=LOGP, **kw):
    return policy_loss(logp.clone().requires_grad_(True), OLD, ADV, mask, settings, **kw)


@pytest.mark.parametrize("agg,expected", [
    ("token_mean", (-1.28 - 0.5 + 0.8) / 3),
    ("seq_mean", ((-1.28 - 0.5) / 2 + 0.8) / 2),
    ("constant", (-1.28 - 0.5 + 0.8) / (2 * 2)),
])
def test_aggregations(agg, expected):
    out = loss(AlgoConfig(epsilon_low=0.2, epsilon_high=0.28, loss_agg=agg))
    assert float(out.loss) == pytest.approx(expected, abs=1e-6)


def test_clip_fractions_low_and_high():
    st = loss().stats
    assert st["clip_frac_high"] == pytest.approx(1 / 3)  # ratio 1.5 > 1.28 with A > 0
    assert st["clip_frac_low"] == pytest.approx(1 / 3)  # ratio 0.7 < 0.8 with A < 0


def test_clipped_tokens_get_no_gradient():
    lp = LOGP.clone().requires_grad_(True)
    policy_loss(lp, OLD, ADV, MASK, S).loss.backward()
    g = lp.grad
    assert g[0, 0] == 0 and g[1, 0] == 0  # both clipped
    assert g[0, 1] == pytest.approx(-0.5 / 3, abs=1e-6)  # d(-r A)/dlogp = -r A / n_tokens
    assert g[1, 1] == 0  # masked


def test_micro_batch_totals_make_accumulation_exact():
    full = loss()
    totals = BatchTotals.of(MASK)
    parts = [policy_loss(LOGP[i:i + 1].clone().requires_grad_(True), OLD[i:i + 1], ADV[i:i + 1], MASK[i:i + 1], S,
                         totals=totals).loss for i in range(2)]
    assert float(sum(parts)) == pytest.approx(float(full.loss), abs=1e-7)


def test_dual_clip_bounds_negative_advantage_loss():
    logp = torch.tensor([[LN(5.0)]])
    adv = torch.tensor([-1.0])
    m = torch.ones(1, 1)
    plain = policy_loss(logp, torch.zeros(1, 1), adv, m, S).loss
    dual = policy_loss(logp, torch.zeros(1, 1), adv, m, AlgoConfig(dual_clip=3.0)).loss
    assert float(plain) == pytest.approx(5.0) and float(dual) == pytest.approx(3.0)


def test_sequence_level_ratio_gspo():
    s = AlgoConfig(ratio_level="sequence", epsilon_low=0.2, epsilon_high=0.28)
    out = loss(s)
    # row 0: exp(mean(ln 1.5, ln 0.5)) = sqrt(0.75), unclipped, A = +1; row 1: ratio 0.7 -> clipped to 0.8, A = -1
    expected = (-math.sqrt(0.75) * 2 + 0.8) / 3
    assert float(out.loss) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("est,fn", [
    ("k1", lambda x: -x), ("k2", lambda x: 0.5 * x * x), ("k3", lambda x: math.exp(x) - x - 1)])
def test_kl_estimators(est, fn):
    logp, ref = torch.tensor([-1.0]), torch.tensor([-1.5])
    assert float(kl_penalty(logp, ref, est)) == pytest.approx(fn(-0.5), abs=1e-6)


def test_kl_term_added_with_beta():
    ref = torch.zeros(2, 2)
    base = loss().loss
    with_kl = loss(AlgoConfig(epsilon_low=0.2, epsilon_high=0.28, beta=0.1), ref_logp=ref)
    k3 = [math.exp(-v) + v - 1 for v in (LN(1.5), LN(0.5), LN(0.7))]
    assert float(with_kl.loss) == pytest.approx(float(base) + 0.1 * sum(k3) / 3, abs=1e-6)
    assert with_kl.stats["ref_kl"] == pytest.approx(sum(k3) / 3, abs=1e-6)
    with pytest.raises(ValueError, match="beta > 0 needs ref_logp"):
        loss(AlgoConfig(beta=0.1))


@pytest.mark.parametrize("mode,weight", [("truncate", 3.0), ("mask", 0.0)])
def test_truncated_importance_sampling(mode, weight):
    logp = torch.tensor([[0.0]])
    rollout = torch.tensor([[-LN(4.0)]])  # pi_trainer / pi_rollout = 4 > cap 3
    s = AlgoConfig(tis="token", tis_mode=mode, tis_cap=3.0)
    out = policy_loss(logp, None, torch.tensor([1.0]), torch.ones(1, 1), s, rollout_logp=rollout)
    assert float(out.loss) == pytest.approx(-1.0 * weight)


def test_llds_acts_only_where_it_should():
    old = torch.zeros(3, 2)
    # row 0: A=+1, drops [0.3, -0.1] (sum > 0) -> active on token 0 only
    # row 1: A=-1, drops [0.5, 0.5] -> inactive (negative advantage)
    # row 2: A=0, drops [-0.2, 0.1] (sum < 0) -> inactive (likelihood did not fall overall)
    logp = torch.tensor([[-0.3, 0.1], [-0.5, -0.5], [0.2, -0.1]])
    adv = torch.tensor([1.0, -1.0, 0.0]).unsqueeze(-1).expand(3, 2)
    term = llds_term(logp, old, adv, torch.ones(3, 2))
    assert torch.allclose(term, torch.tensor([[0.3, 0.0], [0.0, 0.0], [0.0, 0.0]]))
    lp = logp.clone().requires_grad_(True)
    base = policy_loss(lp, old, adv[:, 0], torch.ones(3, 2), AlgoConfig()).loss
    lp2 = logp.clone().requires_grad_(True)
    with_llds = policy_loss(lp2, old, adv[:, 0], torch.ones(3, 2), AlgoConfig(llds_lambda=0.2))
    assert float(with_llds.loss) == pytest.approx(float(base) + 0.2 * 0.3 / 6, abs=1e-6)
    with_llds.loss.backward()
    assert lp2.grad[0, 0] < 0  # the stabiliser pushes that token's likelihood back up


def test_top_entropy_mask():
    ent = torch.tensor([[0.1, 0.9], [0.5, 0.3]])
    m = top_entropy_mask(ent, torch.ones(2, 2), q=0.5)
    assert m.tolist() == [[0.0, 1.0], [1.0, 0.0]]
