"""Per-token logprobs and entropies straight from hidden states: the chunked torch path.

The costliest tensor of a GRPO step is the vocabulary logits, [tokens, V] (Qwen2.5:
V = 151,936, so 8 x 1024 tokens in fp32 is ~5 GB, and autograd keeps several copies).
Here logits are made one [row chunk, vocab tile] block at a time and never kept:

    forward   z = (h W^T + b) / T, one tile at a time, with an online log-sum-exp that also
              carries sum_j p_j z_j (for the entropy) and picks out z[target];
              saves only hidden, weight, bias, targets and the per-row lse.
    backward  recomputes each tile and applies d logp_i / d z_ij = (1[j == t_i] - p_ij) / T:
              grad_hidden += dz W_tile,  grad_W[tile] += dz^T h (fp32),  grad_b[tile] += sum dz.

Peak extra memory is a few [chunk_size, vocab_tile] fp32 blocks, flat in N and V (plus
the fp32 grad_W buffer when the lm_head itself trains). This is the reference semantics
of the Triton kernels in `triton_logprobs.py` and the CPU path.

Targets < 0 (e.g. -100 padding) give logp 0 and no gradient; their entropy is computed.
"""

from __future__ import annotations

import torch

VOCAB_TILE = 8192  # columns per logits block; 1024 x 8192 fp32 = 32 MiB


def _acc_dtype(dtype) -> torch.dtype:
    """fp32 accumulation for half/bf16/fp32 inputs; fp64 stays fp64 (the test gold)."""
    return torch.promote_types(dtype, torch.float32)


def _tile_logits(h, weight, bias, v0, v1, inv_t) -> torch.Tensor:
    """z = (h W[v0:v1]^T + b[v0:v1]) / T as a fresh fp32 (fp64) block [rows, v1 - v0]."""
    z = h @ weight[v0:v1].to(h.dtype).t()
    acc = _acc_dtype(h.dtype)
    z = z.to(acc) if z.dtype != acc else z
    if bias is not None:
        z.add_(bias[v0:v1].to(acc))
    return z.mul_(inv_t)


def _target_in_tile(targets, v0, v1):
    """(hit [rows] bool: the target falls in [v0, v1), local column [rows, 1] clamped into the tile).

    Masks, not nonzero(): no host sync per tile on CUDA."""
    hit = (targets >= v0) & (targets < v1)
    return hit, (targets - v0).clamp(0, v1 - v0 - 1).unsqueeze(1)


@torch.no_grad()
def chunked_forward(hidden, weight, bias, targets, temperature=1.0, chunk_size=1024, vocab_tile=VOCAB_TILE):
    """hidden [M, H], weight [V, H], targets [M] -> (logp [M], entropy [M], lse [M]), fp32 (fp64 if fp64 in)."""
    M, V = hidden.shape[0], weight.shape[0]
    inv_t = 1.0 / float(temperature)
    dev = hidden.device
    logp = torch.empty(M, dtype=_acc_dtype(hidden.dtype), device=dev)
    ent = torch.empty_like(logp)
    lse = torch.empty_like(logp)
    for r0 in range(0, M, chunk_size):
        r1 = min(r0 + chunk_size, M)
        h, t = hidden[r0:r1], targets[r0:r1]
        m = torch.full((r1 - r0,), float("-inf"), dtype=logp.dtype, device=dev)
        s = torch.zeros_like(m)  # sum_j exp(z_j - m)
        w = torch.zeros_like(m)  # sum_j exp(z_j - m) (z_j - m)
        zt = torch.zeros_like(m)  # z[target]
        for v0 in range(0, V, vocab_tile):
            v1 = min(v0 + vocab_tile, V)
            z = _tile_logits(h, weight, bias, v0, v1, inv_t)
            hit, col = _target_in_tile(t, v0, v1)
            zt += torch.where(hit, z.gather(1, col).squeeze(1), 0.0)
            m_new = torch.maximum(m, z.amax(-1))
            # rescale the running sums to the new max (w shifts by s * (m - m_new))
            alpha = torch.exp(m - m_new)
            delta = torch.nan_to_num(m - m_new, nan=0.0, neginf=0.0)
            w = alpha * (w + s * delta)
            s = alpha * s
            z.sub_(m_new[:, None])
            e = torch.exp(z)
            s += e.sum(-1)
            w += e.mul_(z).sum(-1)
            m = m_new
        lse_c = m + torch.log(s)
        lse[r0:r1] = lse_c
        ent[r0:r1] = torch.log(s) - w / s  # H = lse - E_p[z] = log s - E_p[z - m]
        logp[r0:r1] = torch.where(t >= 0, zt - lse_c, torch.zeros_like(lse_c))
    return logp, ent, lse


@torch.no_grad()
def chunked_backward(hidden, weight, bias, targets, lse, grad_logp, temperature=1.0, chunk_size=1024,
                     vocab_tile=VOCAB_TILE, need_hidden=True, need_weight=True, need_bias=True):
    """Recompute logits tile by tile; returns (grad_hidden, grad_weight, grad_bias) in fp32 (fp64 for fp64
    inputs), or None for the ones not needed."""
    M, V = hidden.shape[0], weight.shape[0]
    inv_t = 1.0 / float(temperature)
    acc = _acc_dtype(hidden.dtype)
    g_all = torch.where(targets >= 0, grad_logp.to(acc), torch.zeros((), dtype=acc, device=grad_logp.device))
    gh = torch.zeros(hidden.shape, dtype=acc, device=hidden.device) if need_hidden else None
    gw = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_weight else None
    gb = torch.zeros(V, dtype=acc, device=weight.device) if (need_bias and bias is not None) else None
    for r0 in range(0, M, chunk_size):
        r1 = min(r0 + chunk_size, M)
        h, t, g = hidden[r0:r1], targets[r0:r1], g_all[r0:r1]
        if not bool(g.ne(0).any()):
            continue  # fully masked chunk: every gradient term is zero
        hf = h.to(acc) if gw is not None else None
        for v0 in range(0, V, vocab_tile):
            v1 = min(v0 + vocab_tile, V)
            dz = _tile_logits(h, weight, bias, v0, v1, inv_t)
            dz.sub_(lse[r0:r1, None]).exp_()  # softmax p
            dz.mul_((-g * inv_t)[:, None])  # -g p / T
            hit, col = _target_in_tile(t, v0, v1)
            dz.scatter_add_(1, col, torch.where(hit, g * inv_t, 0.0).unsqueeze(1))  # + g 1[j == t] / T
            if gh is not None:
                gh[r0:r1].addmm_(dz, weight[v0:v1].to(acc))
            if gw is not None:
                gw[v0:v1].addmm_(dz.t(), hf)
            if gb is not None:
                gb[v0:v1] += dz.sum(0)
    return gh, gw, gb


class LinearLogprobs(torch.autograd.Function):
    """(hidden [M, H], weight [V, H], bias [V] | None, targets [M]) -> (logp [M], entropy [M]).

    logp is differentiable w.r.t. hidden, weight and bias; entropy is returned detached.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_size, vocab_tile):
        logp, ent, lse = chunked_forward(hidden, weight, bias, targets, temperature, chunk_size, vocab_tile)
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.cfg = (temperature, chunk_size, vocab_tile)
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp, _grad_ent):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        temperature, chunk_size, vocab_tile = ctx.cfg
        nh, nw, nb = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
        if grad_logp is None:
            return None, None, None, None, None, None, None
        gh, gw, gb = chunked_backward(hidden, weight, bias, targets, lse, grad_logp, temperature, chunk_size,
                                      vocab_tile, need_hidden=nh, need_weight=nw, need_bias=nb)
        return (gh.to(hidden.dtype) if gh is not None else None,
                gw.to(weight.dtype) if gw is not None else None,
                gb.to(bias.dtype) if gb is not None else None,
                None, None, None, None)


def torch_linear_logprobs(hidden, weight, targets, bias=None, temperature=1.0, chunk_size=1024,
                          vocab_tile=VOCAB_TILE):
    """hidden [M, H], targets [M] -> (logp [M] fp32 with grad, entropy [M] fp32 detached)."""
    return LinearLogprobs.apply(hidden, weight, bias, targets, float(temperature), int(chunk_size),
                                int(vocab_tile))


def naive_linear_logprobs(hidden, weight, targets, bias=None, temperature=1.0, upcast=True):
    """Materialises the full [M, V] logits: the obvious implementation the chunked ones must equal.

    upcast=True takes log_softmax in fp32 (fp64 for fp64 inputs); False stays in the input dtype.
    """
    logits = hidden @ weight.t() + (bias if bias is not None else 0)
    if upcast:
        logits = logits.to(_acc_dtype(logits.dtype))
    logsm = torch.log_softmax(logits / temperature, -1)
    logp = logsm.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    logp = torch.where(targets >= 0, logp, torch.zeros_like(logp))
    with torch.no_grad():
        ent = -(logsm.exp() * logsm).sum(-1)
    return logp, ent
