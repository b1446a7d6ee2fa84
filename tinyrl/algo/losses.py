"""The clipped policy-gradient loss of the GRPO family, on per-token logprobs.

Pure torch, the reference semantics: the fused linear loss in tinyrl.kernels computes the
per-token logprobs and entropies without materialising logits, then calls `policy_loss`.
All [N, T] tensors are right-padded completions; `mask` selects the tokens that count.

Micro-batching: pass the totals of the whole optimiser batch (`BatchTotals`), so the
micro-batch losses add up to the batch loss and gradient accumulation is exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch


@dataclass
class BatchTotals:
    """Normalisers of the whole optimiser batch (not of one micro-batch)."""

    num_tokens: float  # valid loss tokens in the batch
    num_seqs: float  # sequences in the batch
    max_len: float  # max completion length (Dr. GRPO's constant normaliser)

    @staticmethod
    def of(mask: torch.Tensor, max_len: int | None = None) -> "BatchTotals":
        return BatchTotals(float(mask.sum()), float(mask.shape[0]), float(max_len or mask.shape[1]))


@dataclass
class LossSettings:
    """The switches policy_loss reads; built from AlgoConfig by `LossSettings.from_config`."""

    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    dual_clip: float | None = None
    ratio_level: str = "token"  # token | sequence (GSPO)
    loss_agg: str = "token_mean"
    beta: float = 0.0
    kl_estimator: str = "k3"
    tis: str = "none"  # none | token | sequence
    tis_mode: str = "truncate"  # truncate | mask
    tis_cap: float = 3.0
    top_entropy_quantile: float | None = None
    llds_lambda: float = 0.0

    @staticmethod
    def from_config(algo) -> "LossSettings":
        return LossSettings(**{k: getattr(algo, k) for k in LossSettings.__dataclass_fields__})


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar, this micro-batch's share of the batch loss
    stats: dict[str, float] = field(default_factory=dict)  # token-weighted means over this micro-batch


# --------------------------------------------------------------------------- pieces


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled tokens (Schulman's k1/k2/k3)."""
    log_r = ref_logp - logp
    return KL_ESTIMATORS[estimator](log_r)


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
    """Sum over valid tokens / (sequences * max completion length) (Dr. GRPO)."""
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


def tis_weights(old_logp, rollout_logp, mask, s: LossSettings) -> torch.Tensor:
    """Truncated importance weights pi_trainer / pi_rollout (detached), [N, T] or [N, 1]."""
    log_w = (old_logp - rollout_logp).detach()
    if s.tis == "sequence":
        log_w = _masked_sum_rows(log_w, mask).unsqueeze(-1)
    w = torch.exp(log_w.clamp(max=20.0))
    if s.tis_mode == "truncate":
        return w.clamp(max=s.tis_cap)
    return (w <= s.tis_cap).to(w.dtype) * w


def top_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, q: float) -> torch.Tensor:
    """1 on the top-q fraction of valid tokens by entropy (ties at the threshold kept)."""
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
    s: LossSettings,
    totals: BatchTotals | None = None,
    ref_logp: torch.Tensor | None = None,  # [N, T] reference policy, needed when beta > 0
    rollout_logp: torch.Tensor | None = None,  # [N, T] rollout-engine logprobs, for TIS
    entropy: torch.Tensor | None = None,  # [N, T] detached token entropies, for the top-q mask
) -> LossOutput:
    mask = mask.to(logp.dtype)
    old_logp = logp.detach() if old_logp is None else old_logp
    adv = advantages if advantages.dim() == 2 else advantages.unsqueeze(-1).expand_as(logp)
    adv = adv.to(logp.dtype)
    if s.top_entropy_quantile is not None and entropy is not None:
        mask = top_entropy_mask(entropy, mask, s.top_entropy_quantile)
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
    kl = None
    if s.beta > 0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp (the adapter-disabled policy)")
        kl = kl_penalty(logp, ref_logp, s.kl_estimator)
        per_tok = per_tok + s.beta * kl
    llds = None
    if s.llds_lambda > 0:
        llds = llds_term(logp, old_logp, adv, mask)
        per_tok = per_tok + s.llds_lambda * llds

    loss = AGGREGATIONS[s.loss_agg](per_tok, mask, totals)

    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        r = ratio.expand_as(logp)
        low = ((r < 1 - s.epsilon_low) & (adv < 0)).to(mask.dtype)
        high = ((r > 1 + s.epsilon_high) & (adv > 0)).to(mask.dtype)
        stats = {
            "pg_loss": float((pg * mask).sum() / n),
            "clip_frac_low": float((low * mask).sum() / n),
            "clip_frac_high": float((high * mask).sum() / n),
            "policy_kl": float(((torch.exp(logp - old_logp) - (logp - old_logp) - 1) * mask).sum() / n),  # k3 of KL(old || new)
            "tokens": float(mask.sum()),
        }
        stats["clip_frac"] = stats["clip_frac_low"] + stats["clip_frac_high"]
        if kl is not None:
            stats["ref_kl"] = float((kl * mask).sum() / n)
        if llds is not None:
            stats["llds"] = float((llds * mask).sum() / n)
    return LossOutput(loss, stats)
