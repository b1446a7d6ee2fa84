"""Decoder internals: what the loaded policy computes with, for the rollout and the update.

- `trunk_of`, `positions`, `cache_kwarg`, `attention_implementation`, `full_attention_only`,
  `caches_under_autograd`: the decoder stack that returns final hidden states and what it takes
  (transformers' private `config._attn_implementation` is read in `attention_implementation` only);
- `prefix_cache`, `prompt_cache`, `common_prefix_length`: KV caches of left-padded prompts, with a
  common prefix read once;
- `packed_hidden` (with `segments`): prompts and rows end to end in one pass under a block mask;
- `lm_head_of`, `output_projection`: the head the fused loss multiplies hidden states by, with a
  LoRA adapter on it folded in;
- `merged_lora_linears`: LoRA linears (and, decoding, 4-bit linears) as one matmul over W + dW;
- `reference_context`: the reference policy (the same model, adapter disabled).

Loading the model is `tinyrl.model.load`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math

from tinyrl.hardware import host_memory
from tinyrl.model.quantize import is_quantized


def reference_context(model):
    """Context in which `model` computes the reference policy (LoRA adapter disabled)."""
    disable = getattr(model, "disable_adapter", None)
    return disable() if disable is not None else contextlib.nullcontext()


def lm_head_of(model):
    """The output projection (an nn.Linear over the vocabulary) of a (peft-wrapped) causal LM."""
    return model.get_output_embeddings()


def output_projection(model):
    """(weight, bias) of the lm_head as the model's forward applies it right now.

    The fused loss multiplies hidden states by this weight itself, so a LoRA adapter on the
    head must be folded in: the base weight plus each active, unmerged adapter's delta
    (differentiable, so the head's LoRA trains), or the base weight alone inside
    `reference_context`. LoRA dropout on the head is not applied (the head acts as in eval
    mode). Folding materialises one [V, H] weight per call: LoRA on lm_head costs a copy of it."""
    head = lm_head_of(model)
    base = getattr(head, "base_layer", head)
    weight = base.weight
    if hasattr(head, "get_delta_weight") and not head.disable_adapters and not head.merged:
        for name in head.active_adapters:
            if name not in head.lora_A:
                continue
            if head.use_dora.get(name, False):
                raise NotImplementedError("DoRA on lm_head is not supported by the fused loss; "
                                          "leave lm_head out of lora.target_modules")
            weight = weight + head.get_delta_weight(name).to(weight.dtype)
    return weight, getattr(base, "bias", None)


MERGE_SHARE = 8  # the merged copies may take up to 1/8 of the machine's RAM


def merge_budget(device) -> int:
    """Bytes `merged_lora_linears` may spend on W + dW copies on `device`: on a CPU, an eighth of
    the RAM (a fixed share of the machine, so the same run merges the same modules every time); on
    a GPU none, since the card's memory plan (`tinyrl plan`) has no room for a copy, and a GPU's
    per-module cost is a kernel launch, not the CPU's Python."""
    return host_memory() // MERGE_SHARE if getattr(device, "type", device) == "cpu" else 0


@contextlib.contextmanager
def merged_lora_linears(model, budget: int | None = None, dequantize: bool = False):
    """Inside: the LoRA-adapted float `nn.Linear`s of `model` run as one F.linear over W + dW (their
    active adapters' deltas, computed on entry under no_grad, dropped on exit), module by module
    while the copies fit in `budget` bytes (default: `merge_budget` of the model's device); yields
    how many.

    For decoding, where the adapter's two extra matmuls, its module calls and peft's Python per
    token cost more than the [out, in] copy: rollout 0.72x on the tiny-arith shape with LoRA on
    every linear, 0.92x on SmolLM2-135M with LoRA on attention (A/B pairs). Same function up to
    fp32 rounding. The base weights are never written (peft's merge() adds dW in place and
    unmerge() subtracts it, leaving rounding in the frozen base, which is also the reference
    policy). Left to peft's own forward: LoRA variants (DoRA), a LoRA bias, and modules whose
    adapters are disabled or merged.

    `dequantize=True` (the decode loop): 4-bit linears too, LoRA-adapted (dequantised W + dW) or
    bare (dequantised W). bitsandbytes' matmul on a CPU dequantises the whole weight on every call
    and then runs F.linear over it (`gemm_4bit`'s default implementation), so a decode loop pays
    that once per token per module; the copy pays it once per call (SmolLM2-135M QLoRA rollout:
    benchmarks/README.md). The same dequantisation and the same F.linear: the same numbers. Only
    where the module computes in the dtype it was quantised from and the model's activations
    have (else bitsandbytes' casts would round differently)."""
    import torch
    from peft.tuners.lora.layer import LoraLayer

    if budget is None:
        budget = merge_budget(next(model.parameters()).device)
    act = model.get_input_embeddings().weight.dtype
    swapped, used, covered = [], 0, set()
    try:
        with torch.no_grad():
            for mod in model.modules():
                if id(mod) in covered:
                    continue
                lora = isinstance(mod, LoraLayer)  # peft's float Linear and its bitsandbytes Linear4bit
                base = mod.base_layer if lora else mod
                if lora and not _mergeable(mod):
                    continue
                quant = is_quantized(getattr(base, "weight", None))  # torchao int8 / fp8 (model.quantization): dequantised
                if type(base) is torch.nn.Linear and base.weight.is_floating_point() and lora and not quant:
                    dense = base.weight
                elif dequantize and (quant and type(base) is torch.nn.Linear or _dequantizable(base, act)):
                    dense = None
                else:
                    continue
                size = base.weight.numel() * base.weight.element_size() if dense is not None or quant else \
                    math.prod(base.weight.quant_state.shape) * act.itemsize
                if used + size > budget:
                    continue
                used += size
                weight = dense if dense is not None else _dequantized(base)
                for name in (mod.active_adapters if lora else ()):
                    if name in mod.lora_A:
                        weight = _plus_delta(weight, mod, name)
                bias = None if base.bias is None else base.bias.to(weight.dtype)
                mod.forward = functools.partial(torch.nn.functional.linear, weight=weight, bias=bias)
                swapped.append(mod)
                covered.add(id(base))
        yield len(swapped)
    finally:
        for mod in swapped:
            del mod.forward


def _plus_delta(weight, mod, name: str):
    """weight + the LoRA module's delta for adapter `name` (a new tensor): scaling x B A as one addmm
    where that is all peft's get_delta_weight does (same dtype, no fan_in_fan_out; a third of its time
    on SmolLM2's 120 adapted linears), else peft's own delta."""
    import torch

    a, b = mod.lora_A[name].weight, mod.lora_B[name].weight
    if weight.dtype == a.dtype == b.dtype and not getattr(mod, "fan_in_fan_out", False):
        return torch.addmm(weight, b, a, alpha=mod.scaling[name])
    return weight + mod.get_delta_weight(name).to(weight.dtype)


def _mergeable(mod) -> bool:
    """A peft LoRA linear whose active adapters are plain LoRA deltas (no variant, no bias, enabled)."""
    active = [n for n in mod.active_adapters if n in mod.lora_A]
    return (not mod.disable_adapters and not mod.merged and not any(n in mod.lora_variant for n in active)
            and not any(getattr(mod, "lora_bias", {}).get(n, False) for n in active))


def _dequantizable(mod, act) -> bool:
    """A bitsandbytes 4-bit linear that computes in `act`, the dtype it was quantised from."""
    state = getattr(getattr(mod, "weight", None), "quant_state", None)
    return (state is not None and state.dtype == act and getattr(mod, "compute_dtype", None) in (None, act)
            and not getattr(state, "packing_format_for_cpu", False))


def _dequantized(mod):
    """The float weight [out, in] a 4-bit linear multiplies by (bitsandbytes' own dequantisation; a torchao
    int8 / fp8 weight's own)."""
    if is_quantized(mod.weight):
        return mod.weight.dequantize()
    import bitsandbytes.functional as bnbf

    return bnbf.dequantize_4bit(mod.weight.data, mod.weight.quant_state)


def trunk_of(model):
    """The decoder stack that returns final hidden states (before the lm_head)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model


def cache_kwarg(trunk) -> str:
    """The KV-cache argument's name: `cache` in transformers 5.x (`past_key_values` deprecated)."""
    return "cache" if "cache" in inspect.signature(type(trunk).forward).parameters else "past_key_values"


def attention_implementation(model_or_trunk) -> str | None:
    """The attention kernel transformers runs (`sdpa`, `eager`, `flash_attention_2`, ...), or None where
    the config names none. The one read of transformers' private `config._attn_implementation`."""
    return getattr(model_or_trunk.config, "_attn_implementation", None)


def full_attention_only(config) -> bool:
    """Whether every layer attends over the whole sequence (no sliding window), so an attention mask
    given in full is the whole story."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return all(t == "full_attention" for t in layer_types)
    return getattr(config, "sliding_window", None) is None


def positions(mask):
    """Position ids of left-padded rows: positions count real tokens only (padding gets 0)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def prefix_cache(trunk, ids, mask, cache=None):
    """The KV cache of left-padded token rows `ids` [k, L] (mask [k, L]), decoder stack only (no
    lm_head). Under autograd the cached keys and values keep their graph: rows that later attend
    to the cache send their gradients back through it (the update's shared prompts). `cache`: the
    (empty) cache object to fill, default a transformers DynamicCache."""
    if cache is None:
        from transformers import DynamicCache

        cache = DynamicCache()
    if ids.shape[1]:
        trunk(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=True,
              **{cache_kwarg(trunk): cache})
    return cache


# Tokens of work, (rows - 1) x prefix length, a common prefix must save to pay for the extra decoder
# pass it costs: a pass over few tokens still streams every weight, which on a CPU takes as long as
# ~40 tokens of compute (SmolLM2-135M, 2 cores: sharing a 26-token system prompt between 2 prompts
# made the update's forward + backward 8% slower), on a GPU ~100; 128 covers both.
MIN_SHARED_PREFIX = 128


def prompt_cache(trunk, ids, mask, cache=None):
    """The KV cache of left-padded token rows `ids` [k, L] (mask [k, L]) and the mask of its columns.

    Rows that open with the same tokens (a chat template's system prompt, a few-shot preamble, an
    agent's tool list) read them once: that common prefix runs as one row whose keys and values are
    repeated for every row (under autograd its graph gathers every row's gradient), then each row
    runs the rest of its tokens after it, left-padded. Each row's cache then reads [prefix | padding
    | rest] instead of [padding | prefix | rest]: the same keys and values at the same positions
    (position ids count real tokens), with the padding moved, so attention must use the returned
    column mask, not `mask`. Where the prefix saves fewer than MIN_SHARED_PREFIX tokens of work,
    `prefix_cache` as it is, with `mask`."""
    import torch

    k, L = ids.shape
    lengths = mask.sum(-1)
    c = common_prefix_length(ids, mask)
    if c * (k - 1) < MIN_SHARED_PREFIX:
        return prefix_cache(trunk, ids, mask, cache), mask
    first = ids[0, L - int(lengths[0]):][:c][None]
    cache = prefix_cache(trunk, first, torch.ones_like(first), cache)
    cache.batch_repeat_interleave(k)
    rest = lengths - c
    r = int(rest.max())
    cols = torch.cat([torch.ones(k, c, dtype=mask.dtype, device=mask.device),
                      (torch.arange(r, device=mask.device)[None] >= (r - rest)[:, None]).to(mask.dtype)], 1)
    if r:
        trunk(input_ids=ids[:, L - r:], attention_mask=cols, position_ids=positions(cols)[:, c:], use_cache=True,
              **{cache_kwarg(trunk): cache})
    return cache, cols


def common_prefix_length(ids, mask) -> int:
    """How many leading real tokens every left-padded row of `ids` shares.

    >>> import torch
    >>> common_prefix_length(torch.tensor([[0, 5, 6, 7], [5, 6, 8, 9]]), torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]))
    2
    """
    import torch

    lengths = mask.sum(-1)
    shortest = int(lengths.min())
    if ids.shape[0] < 2 or shortest == 0:
        return 0
    start = ids.shape[1] - lengths
    aligned = ids.gather(1, start[:, None] + torch.arange(shortest, device=ids.device)[None])
    same = (aligned == aligned[:1]).all(0)
    return int(same.long().cumprod(0).sum())


def packed_hidden(trunk, pp_ids, pp_mask, ids, attn, lengths, row_prompt):
    """One decoder pass over every distinct prompt and every row, packed end to end with no padding.

    The sequence is the prompts' common prefix once (`common_prefix_length`), each distinct prompt's
    rest (`pp_ids` [k, L] left-padded, `pp_mask`: the prompts but their last token), then each row's
    tokens `ids` [n, t1] (its first `lengths`; `attn` [n, L + 1 + t1 - 1]: its full mask, prompt
    then those tokens, for position ids and which are real keys). A block mask lets a prompt token
    see the prefix and its own prompt's earlier tokens, and a row token the prefix, its own
    prompt and its own row's earlier real tokens: each token's attention is the full row's, at the
    same positions, so the hidden states and gradients are those of every row run in full (the
    prompt positions gather their rows' gradients). `row_prompt` [n]: each row's prompt. Returns
    [n, t1, H], 0 past each row's length."""
    import torch

    dev = ids.device
    n, t1 = ids.shape
    L = pp_ids.shape[1]
    plen = pp_mask.sum(-1)
    c = common_prefix_length(pp_ids, pp_mask)
    rest = plen - c
    # what each packed token is: segment kind (0 prefix, 1 a prompt's rest, 2 a row), its prompt, its
    # row, its index within its segment, its token and position
    prompt_of, in_rest = segments(rest)
    row, col = segments(lengths)
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
    if attention_implementation(trunk) == "eager":  # added to the scores: 0 or the dtype's minimum
        act = trunk.get_input_embeddings().weight.dtype
        allowed = torch.zeros(allowed.shape, dtype=act, device=dev).masked_fill(~allowed, torch.finfo(act).min)
    h = trunk(input_ids=tokens[None], attention_mask=allowed, position_ids=pos[None],
              use_cache=False).last_hidden_state[0, c + prompt_of.numel():]
    return h.new_zeros(n * t1, h.shape[-1]).index_copy(0, row * t1 + col, h).view(n, t1, -1)


def segments(lengths):
    """Segments of `lengths` laid end to end: for each element, its segment and its index in it.

    >>> import torch
    >>> [t.tolist() for t in segments(torch.tensor([2, 0, 3]))]
    [[0, 0, 2, 2, 2], [0, 1, 0, 1, 2]]
    """
    import torch

    owner = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)
    return owner, torch.arange(owner.numel(), device=lengths.device) - (torch.cumsum(lengths, 0) - lengths)[owner]


def caches_under_autograd(trunk) -> bool:
    """Whether a forward of `trunk` right now keeps a KV cache it is given, and its graph. transformers
    drops the cache in a gradient-checkpointed training forward (the backward replay would write it
    twice); a forward patched by unsloth (its own checkpointing, its own cache handling) is not
    trusted with one under autograd: not run here (no GPU)."""
    import torch

    if not (torch.is_grad_enabled() and trunk.training):
        return True
    patched = (getattr(type(trunk).forward, "__module__", "") or "").startswith("unsloth")
    return not (patched or getattr(trunk, "gradient_checkpointing", False))
