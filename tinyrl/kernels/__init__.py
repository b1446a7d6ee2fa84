"""tinyrl.kernels: memory-frugal kernels for the GRPO step, each beside its torch reference.

    linear_logprobs          hidden states -> per-token logprobs (+ entropies) without [N, V] logits
    fused_linear_grpo_loss   linear_logprobs, then tinyrl.algo.losses.policy_loss on the [N, T] vectors
    grouped_advantages       rewards + group ids -> GRPO advantages and group stats

`impl="auto"` picks Triton on CUDA when triton is installed, else the chunked torch path
(the CPU path and the reference). Importing this package never imports triton.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field

import torch

from tinyrl.algo.advantages import AdvantageOutput
from tinyrl.algo.losses import BatchTotals, LossSwitches, policy_loss
from tinyrl.errors import MissingExtra
from tinyrl.kernels.grouped_advantage import grouped_advantages as _ga
from tinyrl.kernels.torch_logprobs import torch_linear_logprobs

HAS_TRITON: bool = importlib.util.find_spec("triton") is not None

IMPLS = ("auto", "torch", "triton")


def resolve_impl(impl: str, device) -> str:
    """"auto" -> "triton" on CUDA with triton installed, else "torch"; checks explicit choices."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    is_cuda = torch.device(device).type == "cuda"
    if impl == "auto":
        return "triton" if (is_cuda and HAS_TRITON) else "torch"
    if impl == "triton" and not HAS_TRITON:
        raise MissingExtra("impl='triton' needs triton: pip install 'tinyrl-rlvr[kernels]' (or use impl='torch')")
    return impl


def linear_logprobs(hidden, weight, targets, bias=None, temperature=1.0, chunk_size=1024, impl="auto"):
    """hidden [..., H], weight [V, H], targets [...] -> (logp [...] fp32 with grad, entropy [...] detached).

    logp_i = log softmax((h_i W^T + b) / T)[t_i]; entropy_i = -sum_j p_ij log p_ij of the same
    tempered distribution. Targets < 0 give logp 0 and no gradient.
    """
    lead = targets.shape
    h2 = hidden.reshape(-1, hidden.shape[-1])
    t1 = targets.reshape(-1)
    if h2.shape[0] != t1.shape[0]:
        raise ValueError(f"hidden {tuple(hidden.shape)} and targets {tuple(targets.shape)} disagree on rows")
    if resolve_impl(impl, hidden.device) == "triton":
        from tinyrl.kernels.triton_logprobs import triton_linear_logprobs

        logp, ent = triton_linear_logprobs(h2, weight, t1, bias=bias, temperature=temperature)
    else:
        logp, ent = torch_linear_logprobs(h2, weight, t1, bias=bias, temperature=temperature, chunk_size=chunk_size)
    return logp.reshape(lead), ent.reshape(lead)


@dataclass
class FusedLossOutput:
    loss: torch.Tensor  # scalar, this micro-batch's share of the batch loss (with grad)
    logprobs: torch.Tensor  # [N, T] fp32, current policy logprobs (with grad); 0 where mask == 0
    entropy: torch.Tensor  # [N, T] fp32, detached token entropies; 0 where mask == 0
    stats: dict[str, float] = field(default_factory=dict)  # policy_loss stats + "entropy"


def fused_linear_grpo_loss(
    hidden: torch.Tensor,  # [N, T, H] hidden states at the positions that predict each completion token
    weight: torch.Tensor,  # [V, H] lm_head weight
    targets: torch.Tensor,  # [N, T] long, sampled completion tokens
    mask: torch.Tensor,  # [N, T] tokens in the loss
    advantages: torch.Tensor,  # [N] or [N, T]
    settings: LossSwitches,  # the run's AlgoConfig
    *,
    bias: torch.Tensor | None = None,  # [V]
    old_logp: torch.Tensor | None = None,  # [N, T]; None = detached current logprobs
    ref_logp: torch.Tensor | None = None,  # [N, T]; needed when settings.beta > 0
    rollout_logp: torch.Tensor | None = None,  # [N, T]; rollout-engine logprobs for TIS
    totals: BatchTotals | None = None,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    impl: str = "auto",
) -> FusedLossOutput:
    """GRPO-family loss from hidden states: logprobs of masked-in tokens only, then `policy_loss`.

    Only rows with mask != 0 go through the lm_head (padding costs nothing); every other
    position gets logp 0 and entropy 0, which policy_loss multiplies away.
    """
    N, T, H = hidden.shape
    sel = mask.reshape(-1) != 0
    logp_v, ent_v = linear_logprobs(hidden.reshape(-1, H)[sel], weight, targets.reshape(-1)[sel], bias=bias,
                                    temperature=temperature, chunk_size=chunk_size, impl=impl)
    logp = logp_v.new_zeros(N * T).masked_scatter(sel, logp_v).reshape(N, T)
    ent = ent_v.new_zeros(N * T).masked_scatter(sel, ent_v).reshape(N, T)
    dt = logp.dtype  # fp32 (fp64 for fp64 hidden): the loss math runs at the logprobs' precision
    m = mask.to(dt)
    up = lambda x: None if x is None else x.to(dt)  # noqa: E731
    out = policy_loss(logp, up(old_logp), advantages.to(dt), m, settings, totals=totals,
                      ref_logp=up(ref_logp), rollout_logp=up(rollout_logp))
    stats = dict(out.stats)
    stats["entropy"] = float((ent * m).sum() / m.sum().clamp(min=1))
    return FusedLossOutput(out.loss, logp, ent, stats)


def grouped_advantages(rewards, group, scale="group", eps=1e-4, impl="auto"):
    """rewards [B*G] (NaN = excluded), group [B*G] -> (advantages [B*G], {zero_std_frac, group_std_mean}).

    Same numbers as tinyrl.algo.advantages.grpo (scale group | batch | none).
    """
    return _ga(rewards, group, scale=scale, eps=eps, impl=resolve_impl(impl, rewards.device))


def _kernel_estimator(scale: str | None):
    """An advantage estimator (AdvantageInputs -> AdvantageOutput) computed by the grouped kernel on the
    device the run trains on; `scale` None = the run's `algo.scale` (grpo), "none" = dr_grpo."""
    def estimate(x, device="cuda"):
        adv, st = grouped_advantages(x.rewards.to(device), x.group.to(device), scale=scale or x.scale, eps=x.eps,
                                     impl="auto")
        return AdvantageOutput(adv.to(x.rewards.device), st["zero_std_frac"], st["group_std_mean"])

    return estimate


# estimator name -> the kernel twin of tinyrl.algo.advantages.ESTIMATORS[name] (same numbers); the trainer
# uses these when the fused loss runs on Triton (CUDA), the torch estimators everywhere else
KERNEL_ESTIMATORS = {"grpo": _kernel_estimator(None), "dr_grpo": _kernel_estimator("none")}

__all__ = ["HAS_TRITON", "KERNEL_ESTIMATORS", "FusedLossOutput", "fused_linear_grpo_loss", "grouped_advantages",
           "linear_logprobs", "resolve_impl"]
