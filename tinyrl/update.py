"""The policy-update phase: micro-batched forward, fused linear GRPO loss, backward.

The model's decoder stack gives hidden states; the lm_head is applied inside the fused
loss (tinyrl.kernels), so the [rows, T, V] logits never exist. Micro-batch losses are
normalised by the whole batch's totals, so accumulated gradients equal the full-batch
gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tinyrl import kernels
from tinyrl.algo.losses import BatchTotals, LossSettings
from tinyrl.model import output_projection, reference_context, trunk_of
from tinyrl.rollout.base import Rollouts


@dataclass
class UpdateResult:
    stats: dict  # token-weighted loss stats over the batch
    grad_norm: float  # before clipping
    skipped: bool  # non-finite loss or gradient: optimiser step not taken
    no_signal: bool  # nothing to learn (all advantages 0, no KL term): optimiser step not taken
    logprobs: torch.Tensor  # [N, T] trainer logprobs seen in this pass (detached)
    entropy: torch.Tensor  # [N, T]


def micro_batches(n: int, size: int) -> list[slice]:
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def completion_hidden(model, batch: Rollouts, rows: slice) -> torch.Tensor:
    """Final hidden states at the positions that predict each completion token: [rows, T, H]."""
    device = next(model.parameters()).device
    ids = torch.cat([batch.prompt_ids[rows], batch.completion_ids[rows]], 1).to(device)
    attn = torch.cat([batch.prompt_mask[rows], batch.completion_mask[rows]], 1).to(device)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)  # left padding: positions count real tokens only
    hidden = trunk_of(model)(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).last_hidden_state
    P, T = batch.prompt_ids.shape[1], batch.completion_ids.shape[1]
    return hidden[:, P - 1: P + T - 1]


@torch.no_grad()
def score_logprobs(model, batch: Rollouts, temperature: float, micro_batch: int, chunk_size: int,
                   impl: str, reference: bool = False) -> torch.Tensor:
    """Trainer logprobs [N, T] of the sampled tokens (reference=True: adapter disabled)."""
    out = torch.zeros(batch.completion_ids.shape, dtype=torch.float32)
    with reference_context(model) if reference else _null():
        weight, bias = output_projection(model)  # inside the context: no adapter for the reference
        for rows in micro_batches(batch.num_rows, micro_batch):
            h = completion_hidden(model, batch, rows)
            logp, _ = kernels.linear_logprobs(h, weight, batch.completion_ids[rows].to(h.device), bias=bias,
                                              temperature=temperature, chunk_size=chunk_size, impl=impl)
            out[rows] = logp.float().cpu() * batch.completion_mask[rows]
    return out


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def policy_update(model, optimizer, batch: Rollouts, settings: LossSettings, *, temperature: float,
                  micro_batch: int, max_grad_norm: float, chunk_size: int, impl: str,
                  use_tis: bool) -> UpdateResult:
    """One optimiser step over the whole batch (gradient accumulation over micro-batches).

    A batch with no learning signal (every advantage 0 and no KL or LLDS term: all groups solved
    or all failed) is scored but not stepped: AdamW would still move the weights on its momentum
    and weight decay, drifting the policy on a batch that says nothing."""
    loss_mask = batch.loss_mask.float()
    no_signal = (settings.beta == 0 and settings.llds_lambda == 0
                 and not bool((batch.advantages.reshape(loss_mask.shape[0], -1) != 0).any()))
    totals = BatchTotals.of(loss_mask, batch.completion_ids.shape[1])
    if settings.top_entropy_quantile is not None:  # the loss normaliser counts the kept tokens only
        totals.num_tokens *= settings.top_entropy_quantile
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer.zero_grad(set_to_none=True)
    logprobs = torch.zeros(loss_mask.shape)
    entropy = torch.zeros(loss_mask.shape)
    acc: dict[str, float] = {}
    loss_total = 0.0
    finite = True
    with torch.set_grad_enabled(not no_signal):
        for rows in micro_batches(batch.num_rows, micro_batch):
            h = completion_hidden(model, batch, rows)
            weight, bias = output_projection(model)  # per micro-batch: a head LoRA's graph is freed by backward
            dev = h.device
            pick = lambda t: None if t is None else t[rows].to(dev)  # noqa: E731
            out = kernels.fused_linear_grpo_loss(
                h, weight, batch.completion_ids[rows].to(dev), loss_mask[rows].to(dev), batch.advantages[rows].to(dev),
                settings, bias=bias, old_logp=pick(batch.old_logprobs), ref_logp=pick(batch.ref_logprobs),
                rollout_logp=pick(batch.sampling_logprobs) if use_tis else None, totals=totals,
                temperature=temperature, chunk_size=chunk_size, impl=impl)
            if not torch.isfinite(out.loss):
                finite = False
                break
            if not no_signal:
                out.loss.backward()
            loss_total += float(out.loss.detach())
            logprobs[rows] = out.logprobs.detach().float().cpu()
            entropy[rows] = out.entropy.float().cpu()
            w = out.stats.get("tokens", 0.0)
            for k, v in out.stats.items():
                acc[k] = acc.get(k, 0.0) + (v if k == "tokens" else v * w)
    if no_signal and finite:
        grad_norm, skipped = 0.0, False
    else:
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm)) if finite else float("nan")
        skipped = not (finite and math.isfinite(grad_norm))
        if skipped:
            optimizer.zero_grad(set_to_none=True)  # never apply a non-finite update
        else:
            optimizer.step()
    n_tok = max(acc.pop("tokens", 0.0), 1.0)
    stats = {k: v / n_tok for k, v in acc.items()}
    stats["loss"] = loss_total
    return UpdateResult(stats, grad_norm, skipped, no_signal and finite, logprobs, entropy)
