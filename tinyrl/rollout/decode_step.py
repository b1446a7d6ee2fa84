"""One decode step of a Llama-shaped decoder, written out for the HF engine's rollout loop.

The rollout loop (`tinyrl.rollout.hf`) feeds one token per live row per step. Run through the
model's own forward, a SmolLM2-135M step of 8 rows costs ~45 ms of weight-bound matmuls and, on
top, ~30 ms of transformers' per-call machinery on tiny tensors: the causal-mask builder, the
attention-interface dispatch, kwargs plumbing through 30 layers, a dtype round trip in every norm.
`DecodeStep` runs the same arithmetic (embedding, RMSNorm, the projections, rotary embedding, the
KV-cache append, scaled-dot-product attention over the row's real keys, the gated MLP) as plain
torch calls. Same function up to fp32 rounding; the tests hold it to the model's own forward for
each supported family.

The projections are whatever the modules compute: a plain `nn.Linear` runs as one `F.linear`, a
LoRA linear that `merged_lora_linears` swapped runs as its merged `F.linear`, and anything else
(4-bit, DoRA, an adapter over budget) is called as a module.

Supported: the decoder layers in `LAYERS` (Llama, Qwen2, Qwen3 with its per-head q/k norms,
Mistral) with full attention only, RMSNorm, and the rotary embedding of the model itself (so
every rope scaling it supports). `DecodeStep.of` returns None for anything else, and the loop
decodes through the model's forward as before.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from tinyrl.model.forward import full_attention_only

LAYERS = ("LlamaDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer", "MistralDecoderLayer")
_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm")


class DecodeStep:
    """step(cur [R, 1], attn [R, >= kv], pos [R], cache) -> final hidden states [R, H], appending
    each layer's key and value to `cache` (a transformers cache with per-layer `update`). `attn` is
    the rows' 0/1 attention mask over the cache's columns (extra trailing columns are ignored)."""

    def __init__(self, trunk):
        self.trunk = trunk
        self.layers = [_Layer(layer) for layer in trunk.layers[: trunk.config.num_hidden_layers]]
        self.final_norm = _rms_norm(trunk.norm)

    @classmethod
    def of(cls, trunk) -> "DecodeStep | None":
        """A DecodeStep for this decoder stack, or None where its layers are not the supported shape."""
        return cls(trunk) if supported(trunk) else None

    def __call__(self, cur: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, cache) -> torch.Tensor:
        h = self.trunk.embed_tokens(cur)  # [R, 1, H]
        cos, sin = self.trunk.rotary_emb(h, pos[:, None])  # [R, 1, D]
        cos, sin = cos[:, None], sin[:, None]  # [R, 1, 1, D]: over the heads
        mask = None
        kv = cache.get_seq_length() + 1
        if not bool(attn[:, :kv].all()):  # left padding: each row attends to its real columns only
            mask = attn[:, None, None, :kv].bool()
        h = h[:, 0]
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, mask, cache, i)
        return self.final_norm(h)


class _Layer:
    """One decoder layer's decode arithmetic over [R, H] hidden states."""

    def __init__(self, layer):
        attn, mlp = layer.self_attn, layer.mlp
        self.q, self.k, self.v, self.o = (_linear(getattr(attn, n)) for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
        self.gate, self.up, self.down = (_linear(getattr(mlp, n)) for n in ("gate_proj", "up_proj", "down_proj"))
        self.act = mlp.act_fn
        self.norm_in, self.norm_post = _rms_norm(layer.input_layernorm), _rms_norm(layer.post_attention_layernorm)
        self.q_norm = _rms_norm(attn.q_norm) if hasattr(attn, "q_norm") else None  # Qwen3: per head, before rope
        self.k_norm = _rms_norm(attn.k_norm) if hasattr(attn, "k_norm") else None
        self.head_dim, self.scaling = attn.head_dim, attn.scaling
        self.gqa = attn.num_key_value_groups > 1

    def __call__(self, h, cos, sin, mask, cache, idx):
        R, D = h.shape[0], self.head_dim
        x = self.norm_in(h)
        q, k, v = self.q(x).view(R, -1, D), self.k(x).view(R, -1, D), self.v(x).view(R, -1, D)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q[:, :, None], k[:, :, None], v[:, :, None]  # [R, heads, 1, D]
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        keys, values = cache.layers[idx].update(k, v)
        o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling, enable_gqa=self.gqa)
        h = h + self.o(o.reshape(R, -1))
        x = self.norm_post(h)
        return h + self.down(self.act(self.gate(x)) * self.up(x))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, -1)
    return torch.cat((-x2, x1), -1)


def _rms_norm(norm):
    """x -> weight * x / rms(x), computed in fp32 and cast back, as the model's RMSNorm does."""
    weight, eps = norm.weight, norm.variance_epsilon

    def apply(x):
        dt = x.dtype
        x = x.float()
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(dt)

    return apply


def _linear(mod):
    """The module's function as one call: F.linear over its weight where it is a plain linear (or a
    LoRA linear running merged inside `merged_lora_linears`), else the module itself."""
    if type(mod) is torch.nn.Linear:
        return functools.partial(F.linear, weight=mod.weight, bias=mod.bias)
    fwd = mod.__dict__.get("forward")
    if isinstance(fwd, functools.partial) and fwd.func is F.linear:
        return fwd
    return mod


def supported(trunk) -> bool:
    """Whether every layer of `trunk` is a decoder layer this step reproduces: a listed class, full
    attention (no sliding window), RMSNorms, its projections where the class puts them, and a
    rotary embedding at the model level."""
    config = trunk.config
    if not full_attention_only(config):
        return False
    if not hasattr(trunk, "rotary_emb") or type(trunk.norm).__name__ not in _NORMS:
        return False
    if getattr(config, "pretraining_tp", 1) != 1:
        return False
    for layer in trunk.layers[: config.num_hidden_layers]:
        attn = getattr(layer, "self_attn", None)
        if type(layer).__name__ not in LAYERS or attn is None or not hasattr(layer, "mlp"):
            return False
        if any(type(getattr(layer, n, None)).__name__ not in _NORMS for n in ("input_layernorm", "post_attention_layernorm")):
            return False
        if getattr(attn, "sliding_window", None) is not None or not hasattr(attn, "scaling"):
            return False
    return True
