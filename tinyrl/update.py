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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tinyrl import kernels
from tinyrl.algo.losses import BatchTotals
from tinyrl.model import (cache_kwarg, caches_under_autograd, common_prefix_length, full_attention_only,
                          merged_lora_linears, output_projection, positions, prompt_cache, reference_context, trunk_of)
from tinyrl.rollout.base import Rollouts


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


def completion_hidden(model, batch: Rollouts, mb: MicroBatch, pack: bool | None = None) -> torch.Tensor:
    """Final hidden states at the positions that predict each completion token: [n, T_mb, H].

    Rows with the same prompt (a group's G completions) read it once: each distinct prompt but its
    last token runs through the decoder stack once into a KV cache, and every row runs only its
    last prompt token and completion, attending to its prompt's cache. Under autograd the cache
    keeps its graph, so the prompt positions get the sum of their rows' gradients: the same
    gradient as a forward of every full row (to fp32 rounding), with a G-th of the prompt work.
    Where nothing repeats, or transformers would drop the cache (a gradient-checkpointed training
    forward), every row runs in full.

    Where the attention's block mask costs less than the padding it removes (`_packing_pays`), the
    prompts and rows instead run as one packed pass (`_packed_hidden`: no padding, no cache, the
    same attention); `pack` forces the choice (tests). Hidden states at padding positions are 0
    there, and are never read."""
    device = next(model.parameters()).device
    r, p0, t1 = mb.rows, mb.prompt_start, mb.completion_end
    p_ids, p_mask = batch.prompt_ids[r, p0:].to(device), batch.prompt_mask[r, p0:].to(device)
    c_ids, c_mask = batch.completion_ids[r, :t1].to(device), batch.completion_mask[r, :t1].to(device)
    trunk = trunk_of(model)
    if p_ids.shape[1] >= 2 and caches_under_autograd(trunk):
        prompts, row_prompt = torch.unique(torch.cat([p_ids, p_mask], 1), dim=0, return_inverse=True)
        if prompts.shape[0] < r.numel():
            return _shared_prompt_hidden(trunk, p_ids, p_mask, c_ids, c_mask, prompts.shape[0], row_prompt, pack)
    ids, attn = torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, c_mask], 1)
    hidden = trunk(input_ids=ids, attention_mask=attn, position_ids=positions(attn), use_cache=False).last_hidden_state
    P = p_ids.shape[1]
    return hidden[:, P - 1: P + t1 - 1]


def _shared_prompt_hidden(trunk, p_ids, p_mask, c_ids, c_mask, n_prompts: int, row_prompt,
                          pack: bool | None) -> torch.Tensor:
    """completion_hidden where rows share prompts (`row_prompt`: each row's prompt index): one pass
    over every distinct prompt and every row packed (`_packed_hidden`) where that pays, else one KV
    cache per distinct prompt and the rows padded against it."""
    one = torch.empty(n_prompts, dtype=torch.long, device=p_ids.device)
    one[row_prompt] = torch.arange(p_ids.shape[0], device=p_ids.device)  # a row of each distinct prompt
    ids = torch.cat([p_ids[:, -1:], c_ids[:, :-1]], 1)  # the tokens whose outputs predict c_0 .. c_{t1-1}
    lengths = _completion_lengths(c_mask)
    if pack is None:
        pack = _can_pack(trunk) and _packing_pays(trunk.config, lengths, p_mask[one, :-1].sum(-1))
    if pack:
        return _packed_hidden(trunk, p_ids[one, :-1], p_mask[one, :-1], ids, torch.cat([p_mask, c_mask[:, :-1]], 1),
                              lengths, row_prompt)
    cache, cols = prompt_cache(trunk, p_ids[one, :-1], p_mask[one, :-1])  # cols: the cache's real columns
    attn = torch.cat([cols[row_prompt], p_mask[:, -1:], c_mask[:, :-1]], 1)  # the prompt (cached + last token)
    pos = positions(attn)[:, -c_ids.shape[1]:]                                # and those tokens
    cache.batch_select_indices(row_prompt)  # each row's prompt cache (differentiable indexing)
    return trunk(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True,
                 **{cache_kwarg(trunk): cache}).last_hidden_state


def _completion_lengths(c_mask: torch.Tensor) -> torch.Tensor:
    """Columns each row needs: up to its last completion token (at least 1)."""
    cols = torch.arange(1, c_mask.shape[1] + 1, device=c_mask.device)
    return (c_mask * cols).amax(-1).clamp(min=1)


BLOCK_MASK_ATTENTION = ("sdpa", "eager")  # take a 4D mask as given: sdpa as booleans, eager as additive floats


def _can_pack(trunk) -> bool:
    """A block mask is honoured by the attention (flash kernels take none) and is the whole mask (no
    sliding window for transformers to add)."""
    return (getattr(trunk.config, "_attn_implementation", None) in BLOCK_MASK_ATTENTION
            and full_attention_only(trunk.config))


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


def _packed_hidden(trunk, pp_ids, pp_mask, ids, attn, lengths, row_prompt) -> torch.Tensor:
    """One decoder pass over every distinct prompt and every row, packed end to end with no padding.

    The sequence is the prompts' common prefix once (`common_prefix_length`), each distinct prompt's
    rest (`pp_ids` [k, L] left-padded, `pp_mask`: the prompts but their last token), then each row's
    tokens `ids` [n, t1] (its first `lengths`; `attn` [n, L + 1 + t1 - 1]: its full mask, prompt
    then those tokens, for position ids and which are real keys). A block mask lets a prompt token
    see the prefix and its own prompt's earlier tokens, and a row token the prefix, its own
    prompt and its own row's earlier real tokens: each token's attention is the full row's, at the
    same positions, so the hidden states and gradients are those of every row run in full (the
    prompt positions gather their rows' gradients). Returns [n, t1, H], 0 past each row's length."""
    dev = ids.device
    n, t1 = ids.shape
    L = pp_ids.shape[1]
    plen = pp_mask.sum(-1)
    c = common_prefix_length(pp_ids, pp_mask)
    rest = plen - c
    # what each packed token is: segment kind (0 prefix, 1 a prompt's rest, 2 a row), its prompt, its
    # row, its index within its segment, its token and position
    prompt_of, in_rest = _segments(rest)
    row, col = _segments(lengths)
    pos_rows = positions(attn)[:, -t1:]
    valid = attn[:, -t1:].bool()
    tokens = torch.cat([pp_ids[0, L - int(plen[0]):][:c], pp_ids[prompt_of, L - rest[prompt_of] + in_rest],
                        ids[row, col]])
    pos = torch.cat([torch.arange(c, device=dev), c + in_rest, pos_rows[row, col]])
    kind = torch.cat([torch.zeros(c, dtype=torch.long, device=dev), torch.ones_like(prompt_of), torch.full_like(row, 2)])
    prompt = torch.cat([torch.full((c,), -1, dtype=torch.long, device=dev), prompt_of, row_prompt[row]])
    owner = torch.cat([torch.full((c + prompt_of.numel(),), -1, dtype=torch.long, device=dev), row])
    index = torch.cat([torch.arange(c, device=dev), in_rest, col])
    real = torch.cat([torch.ones(c + prompt_of.numel(), dtype=torch.bool, device=dev), valid[row, col]])
    qk = lambda x: (x[:, None], x[None])  # noqa: E731  (query's value, key's value)
    (kq, kk), (pq, pk), (oq, ok), (iq, ik) = qk(kind), qk(prompt), qk(owner), qk(index)
    earlier = ik <= iq
    allowed = (((kk == 0) & ((kq > 0) | earlier))  # the prefix: causal within, whole to everything after
               | ((kk == 1) & (kq > 0) & (pk == pq) & ((kq == 2) | earlier))  # a prompt's rest: its own
               | ((kk == 2) & (ok == oq) & earlier & real[None]))  # a row's tokens: its own earlier real ones
    allowed = allowed[None, None]
    if trunk.config._attn_implementation == "eager":  # added to the scores: 0 or the dtype's minimum
        act = trunk.get_input_embeddings().weight.dtype
        allowed = torch.zeros(allowed.shape, dtype=act, device=dev).masked_fill(~allowed, torch.finfo(act).min)
    h = trunk(input_ids=tokens[None], attention_mask=allowed, position_ids=pos[None],
              use_cache=False).last_hidden_state[0, c + prompt_of.numel():]
    return h.new_zeros(n * t1, h.shape[-1]).index_copy(0, row * t1 + col, h).view(n, t1, -1)


def _segments(lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Segments of `lengths` laid end to end: for each element, its segment and its index in it.

    >>> [t.tolist() for t in _segments(torch.tensor([2, 0, 3]))]
    [[0, 0, 2, 2, 2], [0, 1, 0, 1, 2]]
    """
    owner = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)
    return owner, torch.arange(owner.numel(), device=lengths.device) - (torch.cumsum(lengths, 0) - lengths)[owner]


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
                  max_grad_norm: float, max_len: int, score_rest: bool = True, dist=None) -> UpdateResult:
    """One optimiser step over the whole batch (gradient accumulation over micro-batches).

    `algo` is the run's AlgoConfig (its loss switches, `chunk_size`, `loss_impl`, `tis`); `max_len`
    is `rollout.max_new_tokens`, Dr. GRPO's constant normaliser. A batch with no learning signal
    (every advantage 0 and no KL or LLDS term: all groups solved or all failed) is not stepped:
    AdamW would still move the weights on its momentum and weight decay, drifting the policy on a
    batch that says nothing.

    `dist` (tinyrl.distributed; default: one process): `batch` is this rank's share of the global
    batch. The normalisers, the no-signal and non-finite decisions are global, and the gradients are
    summed over ranks once, before clipping, so every rank takes the step one process takes."""
    from tinyrl.distributed import Dist

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
    oom = False
    try:
        for mb in micro_batches(batch, rows, micro_batch):
            h = completion_hidden(model, batch, mb)
            weight, bias = output_projection(model)  # per micro-batch: a head LoRA's graph is freed by backward
            dev, t1 = h.device, mb.completion_end
            adv = batch.advantages[mb.rows] if batch.advantages.dim() == 1 else batch.advantages[mb.rows, :t1]
            out = kernels.fused_linear_grpo_loss(
                h, weight, batch.completion_ids[mb.rows, :t1].to(dev), loss_mask[mb.rows, :t1].to(dev), adv.to(dev),
                algo, bias=bias, old_logp=pick(batch.old_logprobs, mb, dev), ref_logp=pick(batch.ref_logprobs, mb, dev),
                rollout_logp=pick(batch.sampling_logprobs, mb, dev) if algo.tis != "none" else None, totals=totals,
                temperature=temperature, chunk_size=algo.chunk_size, impl=algo.loss_impl)
            if not torch.isfinite(out.loss):
                finite = False
                break
            out.loss.backward()
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
    return UpdateResult(stats, grad_norm, skipped, no_signal, logprobs, entropy, rows, N)
