"""Triton kernels for linear logprobs: the GPU path of `torch_logprobs.py`, same numbers.

    forward   `_fwd_kernel`: grid (row blocks, vocab splits). Each program runs the
              h W^T GEMM one [BLOCK_M, BLOCK_V] tile at a time and folds it into an online
              log-sum-exp that also carries sum_j e_j (z_j - m) (entropy) and z[target]; the
              logits never leave registers. The vocab splits (for occupancy) are merged on
              the host in O(splits x M).
    backward  `_dz_kernel`: for one [row chunk, vocab chunk] block, recompute the logits tile by
              tile and write dz = g (1[j == t] - p) / T in the input dtype (fused GEMM +
              softmax-grad epilogue); then two GEMMs (torch) take grad_hidden += dz W_blk and
              grad_W[blk] += dz^T h (fp32 accumulation across blocks). The dz buffer is the only
              extra memory: ROW_CHUNK x VOCAB_CHUNK elements, flat in N and V.

This module imports triton at import time; tinyrl.kernels imports it only when impl="triton".
On CPU it runs under TRITON_INTERPRET=1 (set before this module is imported), for tests.
Block sizes per card and dtype: tinyrl.kernels.configs (checked to compile without spills for sm_75-90 by
tinyrl.kernels.compile_check); the CUDA path has not been run on a GPU here.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from tinyrl.kernels.configs import INTERPRETER_BLOCKS, Blocks, logprob_blocks

ROW_CHUNK = 4096  # rows of one backward block
VOCAB_CHUNK = 8192  # vocabulary columns of one backward block (dz: 4096 x 8192 bf16 = 64 MiB)
NEG: tl.constexpr = tl.constexpr(-1e30)  # finite "-inf": keeps 0 * (-inf) NaNs out of the online sums


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _ieee(hidden) -> bool:
    """fp32 dots in IEEE precision (no TF32); the interpreter multiplies bf16 bit patterns in tl.dot
    (triton-lang/triton#11584), so there the bf16/fp16 operands are upcast (exact) first."""
    return hidden.dtype == torch.float32 or _interpreting()


_DTYPE = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _blocks(kernel: str, hidden) -> Blocks:
    """The kernel's blocks for this card and dtype (tinyrl.kernels.configs); small ones under the interpreter."""
    if _interpreting() or hidden.device.type != "cuda":
        return INTERPRETER_BLOCKS
    major, minor = torch.cuda.get_device_capability(hidden.device)
    return logprob_blocks(kernel, 10 * major + minor, _DTYPE[hidden.dtype])


@triton.jit
def _logit_tile(h_ptr, w_ptr, b_ptr, offs_m, offs_v, row_ok, col_ok, K, stride_h, stride_w, inv_t,
                HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
                BLOCK_K: tl.constexpr):
    """z = (h W^T + b) / T for one [BLOCK_M, BLOCK_V] tile, fp32; NEG outside the vocabulary."""
    acc = tl.zeros((BLOCK_M, BLOCK_V), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = offs_k < K
        a = tl.load(h_ptr + offs_m[:, None] * stride_h + offs_k[None, :], mask=row_ok[:, None] & k_ok[None, :],
                    other=0.0)
        b = tl.load(w_ptr + offs_v[:, None] * stride_w + offs_k[None, :], mask=col_ok[:, None] & k_ok[None, :],
                    other=0.0).to(a.dtype)
        if IEEE:  # fp32 inputs, or any input under the interpreter (its bf16 dot is unsupported)
            acc = tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, tl.trans(b), acc)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_v, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    z = acc * inv_t
    return tl.where(col_ok[None, :], z, NEG)


@triton.jit
def _fwd_kernel(h_ptr, w_ptr, b_ptr, t_ptr, m_out, s_out, w_out, zt_out, M, V, K, stride_h, stride_w, inv_t,
                tiles_per_split, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_m < M
    tgt = tl.load(t_ptr + offs_m, mask=row_ok, other=-1)
    m_i = tl.full((BLOCK_M,), NEG, dtype=tl.float32)
    s_i = tl.zeros((BLOCK_M,), dtype=tl.float32)  # sum e^(z - m)
    w_i = tl.zeros((BLOCK_M,), dtype=tl.float32)  # sum e^(z - m) (z - m)
    zt = tl.zeros((BLOCK_M,), dtype=tl.float32)  # z[target] when the target is in this split
    v_base = pid_s * tiles_per_split * BLOCK_V
    for i in range(0, tiles_per_split):
        offs_v = v_base + i * BLOCK_V + tl.arange(0, BLOCK_V)
        col_ok = offs_v < V
        z = _logit_tile(h_ptr, w_ptr, b_ptr, offs_m, offs_v, row_ok, col_ok, K, stride_h, stride_w, inv_t,
                        HAS_BIAS, IEEE, BLOCK_M, BLOCK_V, BLOCK_K)
        m_new = tl.maximum(m_i, tl.max(z, axis=1))
        alpha = tl.exp(m_i - m_new)
        w_i = alpha * (w_i + s_i * (m_i - m_new))
        s_i = alpha * s_i
        zs = z - m_new[:, None]
        e = tl.where(col_ok[None, :], tl.exp(zs), 0.0)
        s_i += tl.sum(e, axis=1)
        w_i += tl.sum(e * tl.where(col_ok[None, :], zs, 0.0), axis=1)
        zt += tl.sum(tl.where(offs_v[None, :] == tgt[:, None], z, 0.0), axis=1)
        m_i = m_new
    out = pid_s * M + offs_m
    tl.store(m_out + out, m_i, mask=row_ok)
    tl.store(s_out + out, s_i, mask=row_ok)
    tl.store(w_out + out, w_i, mask=row_ok)
    tl.store(zt_out + out, zt, mask=row_ok)


@triton.jit
def _dz_kernel(h_ptr, w_ptr, b_ptr, t_ptr, lse_ptr, g_ptr, dz_ptr, M, V, K, stride_h, stride_w, stride_dz, inv_t,
               HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
               BLOCK_K: tl.constexpr):
    """dz[i, j] = g_i (1[j == t_i] - exp(z_ij - lse_i)) / T for one [BLOCK_M, BLOCK_V] tile."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    row_ok = offs_m < M
    col_ok = offs_v < V
    z = _logit_tile(h_ptr, w_ptr, b_ptr, offs_m, offs_v, row_ok, col_ok, K, stride_h, stride_w, inv_t,
                    HAS_BIAS, IEEE, BLOCK_M, BLOCK_V, BLOCK_K)
    lse = tl.load(lse_ptr + offs_m, mask=row_ok, other=0.0)
    g = tl.load(g_ptr + offs_m, mask=row_ok, other=0.0)
    tgt = tl.load(t_ptr + offs_m, mask=row_ok, other=-1)
    p = tl.exp(z - lse[:, None])
    onehot = tl.where(offs_v[None, :] == tgt[:, None], 1.0, 0.0)
    dz = (onehot - p) * (g * inv_t)[:, None]
    ptrs = dz_ptr + offs_m[:, None] * stride_dz + offs_v[None, :]
    tl.store(ptrs, dz.to(dz_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def _check(hidden, weight):
    if hidden.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"triton linear logprobs takes fp16/bf16/fp32 hidden states, got {hidden.dtype}")
    if hidden.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("hidden and weight need a contiguous last dimension")


def triton_forward(hidden, weight, bias, targets, temperature, splits=None):
    """-> (logp [M], entropy [M], lse [M]) fp32, same definitions as torch_logprobs.chunked_forward.

    splits: vocabulary splits of the grid (None: enough programs to fill the GPU twice).
    """
    _check(hidden, weight)
    M, K = hidden.shape
    V = weight.shape[0]
    b = _blocks("logprobs_fwd", hidden)
    row_blocks, v_tiles = triton.cdiv(M, b.m), triton.cdiv(V, b.v)
    if splits is None:
        sms = torch.cuda.get_device_properties(hidden.device).multi_processor_count if hidden.is_cuda else 1
        splits = triton.cdiv(2 * sms, row_blocks)
    splits = max(1, min(v_tiles, splits))
    tiles_per_split = triton.cdiv(v_tiles, splits)
    splits = triton.cdiv(v_tiles, tiles_per_split)
    part = torch.empty(4, splits, M, dtype=torch.float32, device=hidden.device)
    _fwd_kernel[(row_blocks, splits)](
        hidden, weight, bias if bias is not None else hidden, targets, part[0], part[1], part[2], part[3],
        M, V, K, hidden.stride(0), weight.stride(0), 1.0 / float(temperature), tiles_per_split,
        HAS_BIAS=bias is not None, IEEE=_ieee(hidden), BLOCK_M=b.m, BLOCK_V=b.v, BLOCK_K=b.k,
        num_warps=b.warps, num_stages=b.stages)
    m_k, s_k, w_k, zt_k = part
    m = m_k.max(0).values
    a = torch.exp(m_k - m)
    s = (a * s_k).sum(0)
    w = (a * (w_k + s_k * (m_k - m))).sum(0)
    lse = m + torch.log(s)
    ent = torch.log(s) - w / s
    logp = torch.where(targets >= 0, zt_k.sum(0) - lse, torch.zeros_like(lse))
    return logp, ent, lse


def triton_backward(hidden, weight, bias, targets, lse, grad_logp, temperature, need_weight, need_bias,
                    row_chunk=None, vocab_chunk=None):
    """-> (grad_hidden, grad_weight | None, grad_bias | None), fp32; dz blocks of row_chunk x vocab_chunk."""
    row_chunk, vocab_chunk = row_chunk or ROW_CHUNK, vocab_chunk or VOCAB_CHUNK
    M, K = hidden.shape
    V = weight.shape[0]
    b = _blocks("logprobs_dz", hidden)
    g_all = torch.where(targets >= 0, grad_logp.float(), torch.zeros((), device=grad_logp.device))
    gh = torch.zeros(M, K, dtype=torch.float32, device=hidden.device)
    gw = torch.zeros(V, K, dtype=torch.float32, device=weight.device) if need_weight else None
    gb = torch.zeros(V, dtype=torch.float32, device=weight.device) if (need_bias and bias is not None) else None
    dz_buf = torch.empty(min(M, row_chunk) * min(V, vocab_chunk), dtype=hidden.dtype, device=hidden.device)
    for r0 in range(0, M, row_chunk):
        r1 = min(r0 + row_chunk, M)
        h = hidden[r0:r1]
        for v0 in range(0, V, vocab_chunk):
            v1 = min(v0 + vocab_chunk, V)
            dz = dz_buf[: (r1 - r0) * (v1 - v0)].view(r1 - r0, v1 - v0)
            w_blk = weight[v0:v1]
            _dz_kernel[(triton.cdiv(r1 - r0, b.m), triton.cdiv(v1 - v0, b.v))](
                h, w_blk, bias[v0:v1] if bias is not None else h, targets[r0:r1] - v0, lse[r0:r1], g_all[r0:r1],
                dz, r1 - r0, v1 - v0, K, h.stride(0), w_blk.stride(0), dz.stride(0), 1.0 / float(temperature),
                HAS_BIAS=bias is not None, IEEE=_ieee(hidden), BLOCK_M=b.m, BLOCK_V=b.v,
                BLOCK_K=b.k, num_warps=b.warps, num_stages=b.stages)
            gh[r0:r1] += dz @ w_blk.to(dz.dtype)
            if gw is not None:
                gw[v0:v1] += dz.t() @ h
            if gb is not None:
                gb[v0:v1] += dz.float().sum(0)
    return gh, gw, gb


class TritonLinearLogprobs(torch.autograd.Function):
    """Triton twin of torch_logprobs.LinearLogprobs: (hidden, weight, bias, targets) -> (logp, entropy)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature):
        logp, ent, lse = triton_forward(hidden, weight, bias, targets, temperature)
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature = temperature
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad_logp, _grad_ent):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        if grad_logp is None:
            return None, None, None, None, None
        gh, gw, gb = triton_backward(hidden, weight, bias, targets, lse, grad_logp, ctx.temperature,
                                     ctx.needs_input_grad[1], ctx.needs_input_grad[2])
        return (gh.to(hidden.dtype) if ctx.needs_input_grad[0] else None,
                gw.to(weight.dtype) if gw is not None else None,
                gb.to(bias.dtype) if gb is not None else None, None, None)


def triton_linear_logprobs(hidden, weight, targets, bias=None, temperature=1.0):
    """hidden [M, H], targets [M] -> (logp [M] fp32 with grad, entropy [M] fp32 detached)."""
    hidden = hidden if hidden.stride(-1) == 1 else hidden.contiguous()
    return TritonLinearLogprobs.apply(hidden, weight, bias, targets.contiguous(), float(temperature))
