"""The clipped policy-gradient loss of the GRPO family, on per-token logprobs.

Pure torch, the reference semantics: the fused linear loss in tinyrl.kernels computes the
per-token logprobs and entropies without materialising logits, then calls `policy_loss`.
All [N, T] tensors are right-padded completions; `mask` selects the tokens that count.

The switches come from the run's `AlgoConfig` (`tinyrl.config`), passed as is: the loss has no
copy of them (`LossSwitches` only names the fields it reads).

Off-policy correction (`algo.off_policy`, `OFF_POLICY`): how the engine's logprobs of the sampled tokens
(the behaviour policy) enter the loss, tis | bypass | decoupled; `off_policy_inputs` turns the mode into
`policy_loss`'s own inputs (the clip's anchor `old_logp`, the weight's `rollout_logp`, the switches), so the
fused Triton path serves every mode. docs/algorithms.md has the formulas.

Micro-batching: pass the totals of the whole optimiser batch (`BatchTotals`), so the
micro-batch losses add up to the batch loss and gradient accumulation is exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol

import torch


class LossSwitches(Protocol):
    """The fields of `AlgoConfig` that `policy_loss` reads (documented there)."""

    epsilon_low: float
    epsilon_high: float
    dual_clip: Optional[float]
    ratio_level: str  # token | sequence (GSPO)
    loss_agg: str  # a name in AGGREGATIONS
    beta: float
    kl_estimator: str  # a name in KL_ESTIMATORS
    kl_in_reward: bool  # the KL sits in the token rewards (REINFORCE++), not in the loss
    tis: str  # none | token | sequence
    tis_mode: str  # truncate | mask
    tis_cap: float
    llds_lambda: float
    off_policy: str  # a name in OFF_POLICY (read by `off_policy_inputs`, not by `policy_loss`)
    off_policy_cap: float


@dataclass
class BatchTotals:
    """Normalisers of the whole optimiser batch (not of one micro-batch)."""

    num_tokens: float  # tokens in the loss, over the whole batch
    num_seqs: float  # sequences in the batch
    max_len: float  # Dr. GRPO's constant normaliser: the configured max completion length

    @staticmethod
    def of(mask: torch.Tensor, max_len: int | None = None) -> "BatchTotals":
        """Totals of a batch's loss mask; `max_len` is the run's `rollout.max_new_tokens` (a
        constant, so it must not be the padded width of this batch, which changes every step)."""
        return BatchTotals(float(mask.sum()), float(mask.shape[0]), float(max_len or mask.shape[1]))


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar, this micro-batch's share of the batch loss
    stats: dict[str, float] = field(default_factory=dict)  # token-weighted means over this micro-batch


# --------------------------------------------------------------------------- pieces


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(p || q), for tokens sampled from p: `logp` = log p, `ref_logp` = log q.

    Schulman's estimators of log_r = log q - log p: k1 = -log_r (unbiased, can be negative),
    k2 = log_r^2 / 2, k3 = exp(log_r) - log_r - 1 (unbiased and >= 0). The direction matters:
    for the KL of the policy to its reference the tokens come from the policy, so
    `kl_penalty(logp_policy, logp_ref)`; for how far an update moved the policy, measured on
    tokens sampled before it, `kl_penalty(logp_old, logp_new)` = KL(old || new).

    >>> round(float(kl_penalty(torch.tensor(-1.0), torch.tensor(-1.5), "k3")), 4)
    0.1065
    """
    return KL_ESTIMATORS[estimator](ref_logp - logp)


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "k1": lambda log_r: -log_r,
    "k2": lambda log_r: 0.5 * log_r**2,
    "k3": lambda log_r: torch.exp(log_r) - log_r - 1,
}


def _masked_sum_rows(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum(-1)


def token_mean(per_tok: torch.Tensor, mask: torch.Tensor, totals: BatchTotals) -> torch.Tensor:
    """Sum over every valid token of the batch / their count (DAPO; the default)."""
    return (per_tok * mask).sum() / max(totals.num_tokens, 1.0)


def seq_mean(per_tok: torch.Tensor, mask: torch.Tensor, totals: BatchTotals) -> torch.Tensor:
    """Mean over sequences of each sequence's token mean (original GRPO)."""
    per_seq = _masked_sum_rows(per_tok, mask) / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / max(totals.num_seqs, 1.0)


def constant(per_tok: torch.Tensor, mask: torch.Tensor, totals: BatchTotals) -> torch.Tensor:
    """Sum over valid tokens / (sequences * max completion length) (Dr. GRPO; TRL and Liger
    divide by the configured max completion length, as here)."""
    return (per_tok * mask).sum() / max(totals.num_seqs * totals.max_len, 1.0)


AGGREGATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor, BatchTotals], torch.Tensor]] = {
    "token_mean": token_mean,
    "seq_mean": seq_mean,
    "constant": constant,
}


def importance_log_ratio(logp, old_logp, mask, level: str) -> torch.Tensor:
    """log pi/pi_old per token ([N, T]) or per sequence (GSPO: mean over the sequence, [N, 1])."""
    log_ratio = logp - old_logp
    if level == "token":
        return log_ratio
    if level == "sequence":
        return (_masked_sum_rows(log_ratio, mask) / mask.sum(-1).clamp(min=1)).unsqueeze(-1)
    raise ValueError(f"ratio_level must be token | sequence, got {level!r}")


def tis_weights(old_logp, rollout_logp, mask, s: LossSwitches) -> torch.Tensor:
    """Truncated importance weights pi_trainer / pi_rollout (detached), [N, T] or [N, 1]."""
    log_w = (old_logp - rollout_logp).detach()
    if s.tis == "sequence":
        log_w = _masked_sum_rows(log_w, mask).unsqueeze(-1)
    w = torch.exp(log_w.clamp(max=20.0))
    if s.tis_mode == "truncate":
        return w.clamp(max=s.tis_cap)
    return (w <= s.tis_cap).to(w.dtype) * w


# --------------------------------------------------------------------------- off-policy correction


class SwitchesView:
    """`LossSwitches` with some fields replaced: how an off-policy mode tells `policy_loss` (and the fused
    Triton path, which calls it) what to do without a copy of the config.

    >>> SwitchesView(type("S", (), {"tis": "none", "tis_cap": 3.0})(), tis="token").tis
    'token'
    """

    def __init__(self, base: LossSwitches, **replaced):
        self._base, self._replaced = base, replaced

    def __getattr__(self, name: str):
        replaced = self.__dict__.get("_replaced", {})
        return replaced[name] if name in replaced else getattr(self.__dict__["_base"], name)


@dataclass
class OffPolicyInputs:
    """What the loss gets for one pass: the clip's anchor, the logprobs its weight is taken against, the switches."""

    old_logp: torch.Tensor | None  # [N, T] the clip's anchor pi_old; None = logp.detach() (the first pass)
    rollout_logp: torch.Tensor | None  # [N, T] the weight's denominator (behaviour); None = no weight
    switches: LossSwitches


def _tis_inputs(s: LossSwitches, proximal, behaviour) -> OffPolicyInputs:
    """Today's loss: clip around the weights at the step's start, TIS weight when `tis` is on."""
    return OffPolicyInputs(proximal, behaviour if s.tis != "none" else None, s)


def _bypass_inputs(s: LossSwitches, proximal, behaviour) -> OffPolicyInputs:
    """The behaviour logprobs are the old policy on every pass: clip on pi / pi_behav, no weight."""
    return OffPolicyInputs(behaviour, None, SwitchesView(s, tis="none"))


def _decoupled_inputs(s: LossSwitches, proximal, behaviour) -> OffPolicyInputs:
    """AReaL's decoupled PPO: clip on pi / pi_prox, times w = pi_prox / pi_behav per token, w > cap masked
    (weight 0, the token stays in the normaliser): exactly token-level TIS in mask mode at off_policy_cap."""
    return OffPolicyInputs(proximal, behaviour, SwitchesView(s, tis="token", tis_mode="mask", tis_cap=s.off_policy_cap))


@dataclass(frozen=True)
class OffPolicyMode:
    inputs: Callable[[LossSwitches, Optional[torch.Tensor], torch.Tensor], OffPolicyInputs]
    cap: Callable[[LossSwitches], float]  # the cap `offpolicy_stats` counts weights above


# algo.off_policy -> how the loss treats the behaviour policy (the engine's logprobs of each sampled token)
OFF_POLICY: dict[str, OffPolicyMode] = {
    "tis": OffPolicyMode(_tis_inputs, lambda s: s.tis_cap if s.tis != "none" else s.off_policy_cap),
    "bypass": OffPolicyMode(_bypass_inputs, lambda s: s.off_policy_cap),
    "decoupled": OffPolicyMode(_decoupled_inputs, lambda s: s.off_policy_cap),
}


def off_policy_mode(s: LossSwitches) -> OffPolicyMode:
    """The mode of `s.off_policy` (switches without the field, older callers' stand-ins: "tis", today's).
    `auto` is the config's, decided by tinyrl.config.resolve from the run's staleness; a bare AlgoConfig
    that never went through it (a test's) reads it as "tis", the synchronous loss."""
    name = getattr(s, "off_policy", "tis")
    return OFF_POLICY["tis" if name == "auto" else name]


def off_policy_inputs(s: LossSwitches, proximal: torch.Tensor | None, behaviour: torch.Tensor) -> OffPolicyInputs:
    """The loss inputs of `s.off_policy` for one pass over a batch.

    `proximal`: the weights at the step's start (None on the first pass: the current logprobs, detached;
    later passes: the first pass's logprobs); `behaviour`: the engine's logprobs of the sampled tokens.

        tis        clip on pi/pi_prox; x min(pi_prox/pi_behav, tis_cap) when `tis` is on (today's loss)
        bypass     clip on pi/pi_behav; no weight; every pass anchors to the behaviour policy
        decoupled  clip on pi/pi_prox; x w = pi_prox/pi_behav (detached) per token, 0 where w > off_policy_cap

    decoupled follows AReaL's `ppo_actor_loss_fn` (inclusionAI/AReaL, areal/utils/functional.py): the ratio
    and clip against `proximal_logprobs`, `behav_imp_weight = exp(proximal - old)` multiplying the clipped
    loss, and the tokens whose weight exceeds `behav_imp_weight_cap` masked out of the sum (weight 0) while
    the normaliser still counts every loss token. The `tis*` switches are not read by bypass or decoupled.
    """
    return off_policy_mode(s).inputs(s, proximal, behaviour)


@torch.no_grad()
def offpolicy_stats(old_logp: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, cap: float) -> dict:
    """Statistics of the token weights w = pi_old / pi_behav over the tokens where `mask` is set:
    `offpolicy_ess` = (sum w)^2 / (n sum w^2) in (0, 1], the normalised effective sample size (1: every
    weight equal, as on-policy), and `offpolicy_capped_frac`, the share with w > `cap`. Tokens outside
    `mask` (padding, tool observations, whose behaviour logprob is 0) never count. Empty mask: {}.

    >>> st = offpolicy_stats(torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, -2.0]]), torch.ones(1, 2), cap=5.0)
    >>> {k: round(v, 3) for k, v in st.items()}  # w = 1 and e^2 = 7.39
    {'offpolicy_ess': 0.633, 'offpolicy_capped_frac': 0.5}
    """
    m = mask.bool()
    if not m.any():
        return {}
    w = torch.exp((old_logp[m] - behaviour[m]).double().clamp(max=20.0))
    return {"offpolicy_ess": float(w.sum() ** 2 / (w.numel() * (w**2).sum())),
            "offpolicy_capped_frac": float((w > cap).double().mean())}


def top_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, q: float) -> torch.Tensor:
    """The loss mask restricted to the top-q fraction of its tokens by entropy (ties at the
    threshold kept), selected over everything passed in: give it the whole optimiser batch, not
    a micro-batch, so the selection and the token count it leaves are batch-global and exact
    ("Beyond the 80/20 rule", Wang et al., arXiv 2506.01939).

    >>> top_entropy_mask(torch.tensor([[0.1, 0.9], [0.5, 0.3]]), torch.ones(2, 2), q=0.5).tolist()
    [[0.0, 1.0], [1.0, 0.0]]
    """
    valid = entropy[mask.bool()]
    if valid.numel() == 0:
        return mask
    thresh = torch.quantile(valid.float(), 1.0 - q)
    return mask * (entropy >= thresh).to(mask.dtype)


def llds_term(logp, old_logp, adv_tok, mask) -> torch.Tensor:
    """Lazy likelihood displacement stabiliser (arXiv 2512.04220), per token, before lambda.

    On responses with advantage >= 0 whose total log-likelihood fell since the rollout
    (sum over the span of old - new > 0): max(0, logp_old - logp) on each token.
    """
    drop = (old_logp.detach() - logp)
    seq_adv = _masked_sum_rows(adv_tok, mask) / mask.sum(-1).clamp(min=1)
    fell = _masked_sum_rows(drop.detach(), mask) > 0
    active = ((seq_adv >= 0) & fell).to(logp.dtype).unsqueeze(-1)
    return active * torch.clamp(drop, min=0.0)


# --------------------------------------------------------------------------- the loss


def policy_loss(
    logp: torch.Tensor,  # [N, T] current policy logprobs of the sampled tokens (with grad)
    old_logp: torch.Tensor | None,  # [N, T] logprobs before this batch's updates; None = logp.detach()
    advantages: torch.Tensor,  # [N] or [N, T]
    mask: torch.Tensor,  # [N, T] float, tokens in the loss
    s: LossSwitches,
    totals: BatchTotals | None = None,
    ref_logp: torch.Tensor | None = None,  # [N, T] reference policy: the KL term (beta > 0) and `ref_kl`
    rollout_logp: torch.Tensor | None = None,  # [N, T] rollout-engine logprobs, for TIS (and decoupled's weight)
) -> LossOutput:
    """The micro-batch's share of the batch loss, and its statistics.

    Per token: -min(r A, clip(r) A) (dual-clipped, TIS-weighted if on), + beta * KL(pi || ref)
    when the KL is a loss term (beta > 0 and not `kl_in_reward`), + lambda * LLDS; aggregated by
    `loss_agg` with the whole batch's `totals`. Token selection (top-entropy masking) is the
    caller's: it arrives in `mask`, chosen over the whole batch.

    Stats: `pg_loss`, `clip_frac(_low/_high)`; `pass_kl` = KL(old || current), only when
    `old_logp` is given (a later pass over the same batch); `ref_kl` = k3 KL(pi || ref) when
    `ref_logp` is given; `llds`.
    """
    mask = mask.to(logp.dtype)
    measured_old = old_logp is not None
    old_logp = logp.detach() if old_logp is None else old_logp
    adv = advantages if advantages.dim() == 2 else advantages.unsqueeze(-1).expand_as(logp)
    adv = adv.to(logp.dtype)
    totals = totals or BatchTotals.of(mask)

    log_ratio = importance_log_ratio(logp, old_logp, mask, s.ratio_level)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - s.epsilon_low, 1 + s.epsilon_high)
    pg = -torch.minimum(ratio * adv, clipped * adv)  # [N, T]
    if s.dual_clip is not None:
        pg = torch.where(adv < 0, torch.minimum(pg, -s.dual_clip * adv), pg)
    if s.tis != "none" and rollout_logp is not None:
        pg = pg * tis_weights(old_logp, rollout_logp, mask, s)
    per_tok = pg
    if s.beta > 0 and not s.kl_in_reward:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp (the adapter-disabled policy)")
        per_tok = per_tok + s.beta * kl_penalty(logp, ref_logp, s.kl_estimator)
    llds = None
    if s.llds_lambda > 0:
        llds = llds_term(logp, old_logp, adv, mask)
        per_tok = per_tok + s.llds_lambda * llds

    loss = AGGREGATIONS[s.loss_agg](per_tok, mask, totals)

    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        mean = lambda x: float((x * mask).sum() / n)  # noqa: E731
        r = ratio.expand_as(logp)
        stats = {
            "pg_loss": mean(pg),
            "clip_frac_low": mean(((r < 1 - s.epsilon_low) & (adv < 0)).to(mask.dtype)),
            "clip_frac_high": mean(((r > 1 + s.epsilon_high) & (adv > 0)).to(mask.dtype)),
            "tokens": float(mask.sum()),
        }
        stats["clip_frac"] = stats["clip_frac_low"] + stats["clip_frac_high"]
        if measured_old:
            stats["pass_kl"] = mean(kl_penalty(old_logp, logp.detach()))
        if ref_logp is not None:
            stats["ref_kl"] = mean(kl_penalty(logp.detach(), ref_logp))
        if llds is not None:
            stats["llds"] = mean(llds)
    return LossOutput(loss, stats)
