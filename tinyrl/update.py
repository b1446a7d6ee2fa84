"""The policy-update phase: micro-batched forward, fused linear GRPO loss, backward.

The model's decoder stack gives hidden states; the lm_head is applied inside the fused
loss (tinyrl.kernels), so the [rows, T, V] logits never exist. Micro-batch losses are
normalised by the whole batch's totals, so accumulated gradients equal the full-batch
gradient.

Ways of doing less work that leave the gradient the same (to fp32 rounding):

- rows that cannot matter get no backward. With no KL loss term and no LLDS term, a row whose
  advantages are all 0 has zero gradient: it is left out of the forward and backward, while its
  tokens stay in the normaliser (`BatchTotals` is taken over the whole batch's loss mask). Only
  what a metric needs of it is computed: on the first pass over a batch, a no-grad forward gives
  its entropies and logprobs (the entropy curve and the stale-weights canary cover every row).
- micro-batches are length-bucketed: rows are sorted by length and each micro-batch is cut
  to its own longest prompt and completion, so a batch of mostly short completions does not
  pay for its longest one.
- the rows of one prompt read it once (`completion_hidden`): a group's G completions attend to
  one KV cache of their shared prompt, whose graph carries their gradients back, so the prompt
  costs one forward and backward per micro-batch instead of G.
- no padding inside a micro-batch where that pays: its distinct prompts and its rows run packed
  end to end in one decoder pass, each token attending only to its own prompt and its own row's
  earlier tokens (a block mask), so a micro-batch costs its real tokens, not rows x its longest
  completion, and one pass over the weights, not a prompt pass and a row pass. Prompts that open
  alike (a chat template's system prompt) put that common prefix in the sequence once.

Which of the three ways a micro-batch's forward takes ("full", "shared_prompt", "packed") is
`forward_mode`; `completion_hidden` runs it from the `FORWARDS` table and logs (INFO, tinyrl.update)
each mode the first time the process uses it.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass

import torch

from tinyrl import kernels
from tinyrl.algo.losses import BatchTotals, off_policy_inputs, off_policy_mode
from tinyrl.distributed import Dist
from tinyrl.model.forward import (
    attention_implementation,
    cache_kwarg,
    caches_under_autograd,
    full_attention_only,
    merged_lora_linears,
    output_projection,
    packed_hidden,
    positions,
    prompt_cache,
    reference_context,
    trunk_of,
)
from tinyrl.rollout.base import Rollouts

log = logging.getLogger("tinyrl.update")


@dataclass
class UpdateResult:
    stats: dict  # token-weighted loss stats over the computed rows; "entropy" absent when none was computed
    grad_norm: float  # before clipping
    skipped: bool  # non-finite loss or gradient: optimiser step not taken
    no_signal: bool  # nothing to learn (all advantages 0, no KL or LLDS term): optimiser step not taken
    logprobs: torch.Tensor  # [N, T] trainer logprobs of the loss tokens (0 elsewhere; with score_rest=False
    entropy: torch.Tensor  # [N, T]  also 0 on the rows not trained)  the same tokens' entropies
    rows: torch.Tensor  # [n] long: the rows this pass trained on (forward + backward)
    num_rows: int  # N, the batch's rows
    overflow: bool = False  # skipped because the loss-scaled gradient overflowed (fp16): lower the scale, retry
    offpolicy_cap: float | None = None  # the cap the step metrics count behaviour weights above (losses.OFF_POLICY)


@dataclass
class MicroBatch:
    rows: torch.Tensor  # [n] long, batch rows in this micro-batch
    prompt_start: int  # first prompt column any of its rows uses (left padding before it is cut)
    completion_end: int  # completion columns it needs (right padding after it is cut)


def micro_batches(batch: Rollouts, rows: torch.Tensor, size: int) -> list[MicroBatch]:
    """`rows` in micro-batches of `size`, longest first, each cut to its own widths.

    Sorting by total length puts rows of similar length together (length bucketing); the
    longest go first so the first micro-batch shows the peak memory at once."""
    if rows.numel() == 0:
        return []
    p_len = batch.prompt_mask[rows].sum(-1)
    c_len = batch.completion_mask[rows].sum(-1)
    order = torch.argsort(p_len + c_len, descending=True, stable=True)
    P = batch.prompt_ids.shape[1]
    out = []
    for i in range(0, rows.numel(), size):
        sel = order[i: i + size]
        out.append(MicroBatch(rows[sel], P - int(p_len[sel].max()), max(int(c_len[sel].max()), 1)))
    return out


@dataclass
class RowTokens:
    """A micro-batch's rows on the model's device, cut to its widths; what the forward modes read of them
    is computed when first asked, once."""
    p_ids: torch.Tensor  # [n, P] left-padded prompts
    p_mask: torch.Tensor  # [n, P]
    c_ids: torch.Tensor  # [n, t1] right-padded completions
    c_mask: torch.Tensor  # [n, t1]

    @functools.cached_property
    def _distinct(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.unique(torch.cat([self.p_ids, self.p_mask], 1), dim=0, return_inverse=True)

    @property
    def n_prompts(self) -> int:  # distinct prompts (ids and mask) among the rows
        return self._distinct[0].shape[0]

    @property
    def row_prompt(self) -> torch.Tensor:  # [n] each row's distinct prompt
        return self._distinct[1]

    @functools.cached_property
    def one(self) -> torch.Tensor:  # [k] a row of each distinct prompt
        one = torch.empty(self.n_prompts, dtype=torch.long, device=self.p_ids.device)
        one[self.row_prompt] = torch.arange(self.p_ids.shape[0], device=self.p_ids.device)
        return one

    @functools.cached_property
    def lengths(self) -> torch.Tensor:  # [n] columns each row needs: up to its last completion token (>= 1)
        cols = torch.arange(1, self.c_mask.shape[1] + 1, device=self.c_mask.device)
        return (self.c_mask * cols).amax(-1).clamp(min=1)

    @property
    def after_prompt(self) -> torch.Tensor:  # [n, t1] the tokens whose outputs predict c_0 .. c_{t1-1}
        return torch.cat([self.p_ids[:, -1:], self.c_ids[:, :-1]], 1)


def completion_hidden(model, batch: Rollouts, mb: MicroBatch, pack: bool | None = None) -> torch.Tensor:
    """Final hidden states at the positions that predict each completion token: [n, T_mb, H].

    Run in one of three ways (`forward_mode` picks, `FORWARDS` runs it), each giving the hidden states
    and the gradient of a forward of every full row (to fp32 rounding); hidden states at padding
    positions are 0 there, and are never read. `pack` forces packing or not where rows share prompts
    (tests)."""
    device = next(model.parameters()).device
    r, p0, t1 = mb.rows, mb.prompt_start, mb.completion_end
    rows = RowTokens(batch.prompt_ids[r, p0:].to(device), batch.prompt_mask[r, p0:].to(device),
                     batch.completion_ids[r, :t1].to(device), batch.completion_mask[r, :t1].to(device))
    trunk = trunk_of(model)
    mode = forward_mode(trunk, rows, pack)
    if mode not in _MODES_LOGGED:  # once per mode and process, not per micro-batch
        _MODES_LOGGED.add(mode)
        log.info("update forward mode %r: %s", mode, FORWARD_MODES[mode])
    return FORWARDS[mode](trunk, rows)


FORWARD_MODES = {
    "full": "every row runs its prompt and completion in full",
    "shared_prompt": "each distinct prompt runs once into a KV cache that its rows attend to",
    "packed": "distinct prompts and rows packed end to end in one pass under a block mask, no padding",
}
_MODES_LOGGED: set[str] = set()


def forward_mode(trunk, rows: RowTokens, pack: bool | None = None) -> str:
    """How `completion_hidden` runs a micro-batch (one of `FORWARD_MODES`).

    Rows with the same prompt (a group's G completions) read it once: "shared_prompt", each distinct
    prompt but its last token runs through the decoder stack once into a KV cache, and every row runs
    only its last prompt token and completion against it (under autograd the cache keeps its graph,
    so the prompt positions get the sum of their rows' gradients), a G-th of the prompt work; or
    "packed", where the attention's block mask costs less than the padding it removes
    (`_packing_pays`), the prompts and rows run as one pass with no padding and no cache
    (`_packed_hidden`). Where nothing repeats, or transformers would drop the cache (a
    gradient-checkpointed training forward), "full": every row runs in full."""
    if rows.p_ids.shape[1] < 2 or not caches_under_autograd(trunk) or rows.n_prompts >= rows.p_ids.shape[0]:
        return "full"
    if pack is None:
        pack = _can_pack(trunk) and _packing_pays(trunk.config, rows.lengths, rows.p_mask[rows.one, :-1].sum(-1))
    return "packed" if pack else "shared_prompt"


def _full_hidden(trunk, rows: RowTokens) -> torch.Tensor:
    """completion_hidden with every row run in full (prompt and completion, padded)."""
    ids, attn = torch.cat([rows.p_ids, rows.c_ids], 1), torch.cat([rows.p_mask, rows.c_mask], 1)
    hidden = trunk(input_ids=ids, attention_mask=attn, position_ids=positions(attn), use_cache=False).last_hidden_state
    P = rows.p_ids.shape[1]
    return hidden[:, P - 1: P + rows.c_ids.shape[1] - 1]


def _shared_prompt_hidden(trunk, rows: RowTokens) -> torch.Tensor:
    """completion_hidden where rows share prompts: one KV cache per distinct prompt (its last token
    left out) and the rows, padded, run against it."""
    one, row_prompt = rows.one, rows.row_prompt
    cache, cols = prompt_cache(trunk, rows.p_ids[one, :-1], rows.p_mask[one, :-1])  # cols: its real columns
    attn = torch.cat([cols[row_prompt], rows.p_mask[:, -1:], rows.c_mask[:, :-1]], 1)  # the prompt (cached +
    pos = positions(attn)[:, -rows.c_ids.shape[1]:]                                   # last token), the tokens
    cache.batch_select_indices(row_prompt)  # each row's prompt cache (differentiable indexing)
    return trunk(input_ids=rows.after_prompt, attention_mask=attn, position_ids=pos, use_cache=True,
                 **{cache_kwarg(trunk): cache}).last_hidden_state


BLOCK_MASK_ATTENTION = ("sdpa", "eager")  # take a 4D mask as given: sdpa as booleans, eager as additive floats


def _can_pack(trunk) -> bool:
    """A block mask is honoured by the attention (flash kernels take none) and is the whole mask (no
    sliding window for transformers to add)."""
    return attention_implementation(trunk) in BLOCK_MASK_ATTENTION and full_attention_only(trunk.config)


def _packing_pays(config, lengths: torch.Tensor, prompt_lengths: torch.Tensor) -> bool:
    """Whether one packed pass costs fewer FLOPs than the prompts' cache pass plus the padded rows.
    Per layer, a token costs its projections and MLP, ~2 (4 d^2 + 3 d i), and each (query, key) pair
    of the attention ~4 d. Padded: every row runs the micro-batch's longest completion against its
    prompt (`prompt_lengths`: each distinct prompt's cached tokens); packed: only real tokens, but
    each attends (masked) over the whole packed sequence. The second pass's own overhead (every
    weight read again) is left out: it only tips the balance further towards packing."""
    d = config.hidden_size
    per_token = 2 * (4 * d * d + 3 * d * getattr(config, "intermediate_size", 4 * d))
    n, t, q = lengths.numel(), int(lengths.max()), int(lengths.sum())
    k, cached, longest = prompt_lengths.numel(), int(prompt_lengths.sum()), int(prompt_lengths.max())
    padded = n * t * per_token + n * t * (longest + t) * 4 * d + k * longest * longest * 4 * d
    packed = q * per_token + (cached + q) * (cached + q) * 4 * d
    return packed < padded


def _packed_hidden(trunk, rows: RowTokens) -> torch.Tensor:
    """completion_hidden as one packed pass (`packed_hidden`): each distinct prompt but its last token,
    then each row's tokens after it, end to end, no padding."""
    return packed_hidden(trunk, rows.p_ids[rows.one, :-1], rows.p_mask[rows.one, :-1], rows.after_prompt,
                         torch.cat([rows.p_mask, rows.c_mask[:, :-1]], 1), rows.lengths, rows.row_prompt)


FORWARDS = {"full": _full_hidden, "shared_prompt": _shared_prompt_hidden, "packed": _packed_hidden}


@dataclass
class Scored:
    logprobs: torch.Tensor  # [N, T] fp32, 0 outside the scored rows' action tokens
    entropy: torch.Tensor  # [N, T] fp32, the same tokens' entropies


@torch.no_grad()
def score(model, batch: Rollouts, temperature: float, micro_batch: int, chunk_size: int, impl: str,
          reference: bool = False, rows: torch.Tensor | None = None) -> Scored:
    """Trainer logprobs and entropies of the sampled (action) tokens, no activations kept
    (reference=True: adapter disabled; rows: only these rows, default all)."""
    N, T = batch.completion_ids.shape
    logp_out, ent_out = torch.zeros(N, T), torch.zeros(N, T)
    rows = torch.arange(N) if rows is None else rows
    action = batch.action_mask
    # no grad: each LoRA linear as one matmul over W + dW (the reference: adapter off, nothing to merge)
    with reference_context(model) if reference else merged_lora_linears(model):
        weight, bias = output_projection(model)  # inside the context: no adapter for the reference
        for mb in micro_batches(batch, rows, micro_batch):
            h = completion_hidden(model, batch, mb)
            t1 = mb.completion_end
            sel = action[mb.rows, :t1] != 0  # the head only where a logprob is kept
            logp, ent = kernels.linear_logprobs(h[sel.to(h.device)], weight,
                                                batch.completion_ids[mb.rows, :t1][sel].to(h.device), bias=bias,
                                                temperature=temperature, chunk_size=chunk_size, impl=impl)
            for out, v in ((logp_out, logp), (ent_out, ent)):
                part = torch.zeros(sel.shape)
                part[sel] = v.float().cpu()
                out[mb.rows, :t1] = part
    return Scored(logp_out, ent_out)


def score_logprobs(model, batch: Rollouts, temperature: float, micro_batch: int, chunk_size: int,
                   impl: str, reference: bool = False, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Trainer logprobs [N, T] of the sampled tokens (reference=True: adapter disabled)."""
    return score(model, batch, temperature, micro_batch, chunk_size, impl, reference, rows).logprobs


def has_signal_beyond_advantages(algo) -> bool:
    """Whether a loss term other than the advantage-weighted ratio puts gradient on every row."""
    return (algo.beta > 0 and not algo.kl_in_reward) or algo.llds_lambda > 0


def rows_to_compute(batch: Rollouts, algo) -> torch.Tensor:
    """The rows whose gradient can be non-zero: all rows with loss tokens when another term acts on
    every row, else only those with a non-zero advantage on some loss token."""
    in_loss = batch.loss_mask.sum(-1) > 0
    if not has_signal_beyond_advantages(algo):
        adv = batch.advantages if batch.advantages.dim() == 2 else batch.advantages[:, None]
        in_loss &= ((adv != 0) & (batch.loss_mask != 0)).any(-1)
    return torch.nonzero(in_loss).squeeze(-1)


def policy_update(model, optimizer, batch: Rollouts, algo, *, temperature: float, micro_batch: int,
                  max_grad_norm: float, max_len: int, score_rest: bool = True, dist=None,
                  loss_scale: float = 1.0) -> UpdateResult:
    """One optimiser step over the whole batch (gradient accumulation over micro-batches).

    `algo` is the run's AlgoConfig (its loss switches, `chunk_size`, `loss_impl`, `tis`, `off_policy`: which
    logprobs anchor the clip and weigh each token, `tinyrl.algo.losses.off_policy_inputs`); `max_len`
    is `rollout.max_new_tokens`, Dr. GRPO's constant normaliser. A batch with no learning signal
    (every advantage 0 and no KL or LLDS term: all groups solved or all failed) is not stepped:
    AdamW would still move the weights on its momentum and weight decay, drifting the policy on a
    batch that says nothing.

    `dist` (tinyrl.distributed; default: one process): `batch` is this rank's share of the global
    batch. The normalisers, the no-signal and non-finite decisions are global, and the gradients are
    summed over ranks once, before clipping, so every rank takes the step one process takes.

    `loss_scale` (fp16 training, tinyrl.trainer.LOSS_SCALE): each micro-batch's loss is multiplied by
    it before the backward, so small gradients of the fp16 activations do not flush to zero, and the
    gradients are divided by it before the exchange and the clipping: the same update, unscaled. A
    non-finite gradient at a scale > 1 is an overflow (`overflow`): the step is not taken."""
    dist = dist or Dist()
    loss_mask = batch.loss_mask.float()
    local = BatchTotals.of(loss_mask, max_len)  # the whole batch, skipped rows included
    totals = BatchTotals(dist.all_reduce_sum(local.num_tokens), dist.all_reduce_sum(local.num_seqs), local.max_len)
    rows = rows_to_compute(batch, algo)
    no_signal = dist.all_reduce_sum(rows.numel()) == 0
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer.zero_grad(set_to_none=True)
    N, T = loss_mask.shape
    logprobs, entropy = torch.zeros(N, T), torch.zeros(N, T)
    acc: dict[str, float] = {}
    loss_total, finite = 0.0, True
    pick = lambda t, mb, dev: None if t is None else t[mb.rows, :mb.completion_end].to(dev)  # noqa: E731
    # algo.off_policy: the clip's anchor, the weight's denominator and the switches (tis: today's, unchanged)
    off = off_policy_inputs(algo, batch.old_logprobs, batch.sampling_logprobs)
    oom = False
    try:
        for mb in micro_batches(batch, rows, micro_batch):
            h = completion_hidden(model, batch, mb)
            weight, bias = output_projection(model)  # per micro-batch: a head LoRA's graph is freed by backward
            dev, t1 = h.device, mb.completion_end
            adv = batch.advantages[mb.rows] if batch.advantages.dim() == 1 else batch.advantages[mb.rows, :t1]
            out = kernels.fused_linear_grpo_loss(
                h, weight, batch.completion_ids[mb.rows, :t1].to(dev), loss_mask[mb.rows, :t1].to(dev), adv.to(dev),
                off.switches, bias=bias, old_logp=pick(off.old_logp, mb, dev), ref_logp=pick(batch.ref_logprobs, mb, dev),
                rollout_logp=pick(off.rollout_logp, mb, dev), totals=totals,
                temperature=temperature, chunk_size=algo.chunk_size, impl=algo.loss_impl)
            if not torch.isfinite(out.loss):
                finite = False
                break
            (out.loss * loss_scale if loss_scale != 1 else out.loss).backward()
            loss_total += float(out.loss.detach())
            logprobs[mb.rows, :t1] = out.logprobs.detach().float().cpu()
            entropy[mb.rows, :t1] = out.entropy.float().cpu()
            w = out.stats.get("tokens", 0.0)
            for k, v in out.stats.items():
                acc[k] = acc.get(k, 0.0) + (v if k == "tokens" else v * w)
        if score_rest and finite:  # the rows without gradient: their logprobs and entropies only, no graph
            rest = torch.nonzero((loss_mask.sum(-1) > 0) & ~torch.isin(torch.arange(N), rows)).squeeze(-1)
            if rest.numel():
                scored = score(model, batch, temperature, micro_batch, algo.chunk_size, algo.loss_impl, rows=rest)
                keep = loss_mask[rest]
                logprobs[rest], entropy[rest] = scored.logprobs[rest] * keep, scored.entropy[rest] * keep
    except torch.OutOfMemoryError:
        if dist.world == 1:
            raise
        oom = True
    if dist.any(oom):  # every rank redoes the step with a smaller micro-batch, or none would match the others
        optimizer.zero_grad(set_to_none=True)
        raise torch.OutOfMemoryError("out of memory in the update on one of the processes")
    finite = not dist.any(not finite)
    if no_signal:
        grad_norm, skipped = 0.0, False
    else:
        if finite:
            if loss_scale != 1:
                for p in params:
                    if p.grad is not None:
                        p.grad.div_(loss_scale)  # unscaled before the exchange and the clipping
            dist.all_reduce_grads(params)  # the one gradient exchange of the step
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm)) if finite else float("nan")
        skipped = not (finite and math.isfinite(grad_norm))
        if skipped:
            optimizer.zero_grad(set_to_none=True)  # never apply a non-finite update
        else:
            optimizer.step()
    n_tok = acc.pop("tokens", 0.0)
    stats = {k: v / n_tok for k, v in acc.items()} if n_tok else {}
    stats["loss"] = loss_total
    return UpdateResult(stats, grad_norm, skipped, no_signal, logprobs, entropy, rows, N, skipped and loss_scale > 1,
                        off_policy_mode(algo).cap(algo))


# fp16 training's dynamic loss scale (torch.amp.GradScaler's defaults); bf16 and fp32 need none
LOSS_SCALE = {"initial": 2.0 ** 16, "growth_steps": 2000, "max": 2.0 ** 24}


def initial_loss_scale(cfg) -> float:
    """A loss scale for a model computing in float16 (its small gradients flush to zero without one); else 1."""
    return LOSS_SCALE["initial"] if cfg.model.dtype == "float16" else 1.0


def next_loss_scale(scale: float, clean_steps: int, result: UpdateResult) -> tuple[float, int]:
    """(scale, clean steps since it changed) after an update: halved on an overflow, doubled after
    LOSS_SCALE["growth_steps"] clean steps, never below 2 once scaling is on (1 means off).

    >>> r = lambda **kw: UpdateResult({}, 1.0, kw.get("overflow", False), False, None, None, None, 0, kw.get("overflow", False))
    >>> next_loss_scale(1024.0, 5, r(overflow=True)), next_loss_scale(1024.0, 1999, r()), next_loss_scale(1.0, 0, r())
    ((512.0, 0), (2048.0, 0), (1.0, 0))
    """
    if scale == 1:
        return scale, clean_steps
    if result.overflow:
        log.info("fp16 loss scale: the gradient overflowed at %g; the step was not taken, the scale halves", scale)
        return max(scale / 2, 2.0), 0
    if result.skipped or result.no_signal:
        return scale, clean_steps
    if clean_steps + 1 >= LOSS_SCALE["growth_steps"]:
        return min(scale * 2, LOSS_SCALE["max"]), 0
    return scale, clean_steps + 1
