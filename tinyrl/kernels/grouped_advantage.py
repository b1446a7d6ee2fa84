"""Grouped GRPO advantages: rewards [B*G] + group ids -> advantages and per-group stats.

The torch path is tinyrl.algo.advantages.grpo itself (the reference). The Triton path is one
launch of one program that walks the rows in tiles, in float64 like the reference:

    1. per group: count, sum -> mean; then sum of squared deviations -> unbiased std
       (groups with < 2 valid rewards: std 0; all-equal groups: std exactly 0, found by
       max == min; the reference can report ~1e-17 there for fp64 rewards, see the tests);
       batch count / mean / std for scale="batch"
    2. per row: (r - mean_g) / (std + eps), NaN rewards -> 0
    3. zero_std_frac and group_std_mean over groups with >= 2 valid rewards

Advantage computation is tiny next to the GRPO step; the kernel exists so the whole step can
stay on the GPU without host syncs in the middle, and as a tested pair with its reference.
"""

from __future__ import annotations

import torch

from tinyrl.algo.advantages import AdvantageInputs, grpo
from tinyrl.kernels.configs import ADVANTAGE_BLOCK_B, ADVANTAGE_WARPS, advantage_block_n

SCALES = {"none": 0, "group": 1, "batch": 2}


def torch_grouped_advantages(rewards, group, scale="group", eps=1e-4):
    """The reference: tinyrl.algo.advantages.grpo (scale="none" equals dr_grpo)."""
    out = grpo(AdvantageInputs(rewards, group, scale=scale, eps=eps))
    return out.advantages, {"zero_std_frac": out.zero_std_frac, "group_std_mean": out.group_std_mean}


_KERNEL = None


def _build_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _group_adv_kernel(r_ptr, g_ptr, adv_ptr, mean_ptr, std_ptr, stats_ptr, N, B, eps,
                          SCALE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr):
        f64 = tl.float64
        # batch count, mean, std over valid rewards (scale="batch")
        b_cnt = tl.zeros((BLOCK_N,), dtype=f64)
        b_sum = tl.zeros((BLOCK_N,), dtype=f64)
        for n0 in range(0, N, BLOCK_N):
            offs = n0 + tl.arange(0, BLOCK_N)
            r = tl.load(r_ptr + offs, mask=offs < N, other=0.0).to(f64)
            ok = (r == r) & (offs < N)
            b_cnt += tl.where(ok, 1.0, 0.0)
            b_sum += tl.where(ok, r, 0.0)
        cnt_all = tl.sum(b_cnt, 0)
        mean_all = tl.sum(b_sum, 0) / tl.maximum(cnt_all, 1.0)
        b_ss = tl.zeros((BLOCK_N,), dtype=f64)
        for n0 in range(0, N, BLOCK_N):
            offs = n0 + tl.arange(0, BLOCK_N)
            r = tl.load(r_ptr + offs, mask=offs < N, other=0.0).to(f64)
            d = tl.where((r == r) & (offs < N), r - mean_all, 0.0)
            b_ss += d * d
        std_all = tl.where(cnt_all > 1, tl.sqrt(tl.sum(b_ss, 0) / tl.maximum(cnt_all - 1, 1.0)), 0.0)

        # per-group mean and std, BLOCK_B groups at a time against every row tile
        n_ok = tl.sum(tl.zeros((BLOCK_B,), dtype=f64), 0)
        n_zero = n_ok
        std_sum = n_ok
        for b0 in range(0, B, BLOCK_B):
            gb = b0 + tl.arange(0, BLOCK_B)
            cnt = tl.zeros((BLOCK_B,), dtype=f64)
            tot = tl.zeros((BLOCK_B,), dtype=f64)
            hi = tl.full((BLOCK_B,), float("-inf"), dtype=f64)
            lo = tl.full((BLOCK_B,), float("inf"), dtype=f64)
            for n0 in range(0, N, BLOCK_N):
                offs = n0 + tl.arange(0, BLOCK_N)
                r = tl.load(r_ptr + offs, mask=offs < N, other=0.0).to(f64)
                g = tl.load(g_ptr + offs, mask=offs < N, other=-1)  # -1: padding rows match no group
                hit = (g[None, :] == gb[:, None]) & (r == r)[None, :]
                rr = r[None, :] + tl.zeros((BLOCK_B, BLOCK_N), dtype=f64)
                cnt += tl.sum(tl.where(hit, 1.0, 0.0), 1)
                tot += tl.sum(tl.where(hit, rr, 0.0), 1)
                hi = tl.maximum(hi, tl.max(tl.where(hit, rr, float("-inf")), 1))
                lo = tl.minimum(lo, tl.min(tl.where(hit, rr, float("inf")), 1))
            mean = tot / tl.maximum(cnt, 1.0)
            mean = tl.where((cnt > 0) & (hi == lo), hi, mean)  # all equal: the exact value, not sum / n
            ss = tl.zeros((BLOCK_B,), dtype=f64)
            for n0 in range(0, N, BLOCK_N):
                offs = n0 + tl.arange(0, BLOCK_N)
                r = tl.load(r_ptr + offs, mask=offs < N, other=0.0).to(f64)
                g = tl.load(g_ptr + offs, mask=offs < N, other=-1)  # -1: padding rows match no group
                hit = (g[None, :] == gb[:, None]) & (r == r)[None, :]
                d = tl.where(hit, r[None, :] - mean[:, None], 0.0)
                ss += tl.sum(d * d, 1)
            ok2 = cnt >= 2
            std = tl.where(ok2 & (hi > lo), tl.sqrt(ss / tl.maximum(cnt - 1, 1.0)), 0.0)
            in_b = gb < B
            tl.store(mean_ptr + gb, mean, mask=in_b)
            tl.store(std_ptr + gb, std, mask=in_b)
            ok2 = ok2 & in_b
            n_ok += tl.sum(tl.where(ok2, 1.0, 0.0), 0)
            n_zero += tl.sum(tl.where(ok2 & (std == 0), 1.0, 0.0), 0)
            std_sum += tl.sum(tl.where(ok2, std, 0.0), 0)
        tl.debug_barrier()  # the per-group stores above are read back (gathered) below

        for n0 in range(0, N, BLOCK_N):
            offs = n0 + tl.arange(0, BLOCK_N)
            in_n = offs < N
            r = tl.load(r_ptr + offs, mask=in_n, other=0.0).to(f64)
            g = tl.load(g_ptr + offs, mask=in_n, other=0)
            adv = r - tl.load(mean_ptr + g, mask=in_n, other=0.0)
            if SCALE == 1:
                adv = adv / (tl.load(std_ptr + g, mask=in_n, other=0.0) + eps)
            if SCALE == 2:
                adv = adv / (std_all + eps)
            adv = tl.where(r == r, adv, 0.0)
            tl.store(adv_ptr + offs, adv.to(adv_ptr.dtype.element_ty), mask=in_n)
        tl.store(stats_ptr + 0, tl.where(n_ok > 0, n_zero / tl.maximum(n_ok, 1.0), 0.0))
        tl.store(stats_ptr + 1, tl.where(n_ok > 0, std_sum / tl.maximum(n_ok, 1.0), 0.0))

    return _group_adv_kernel


def triton_grouped_advantages(rewards, group, scale="group", eps=1e-4):
    """Triton twin of torch_grouped_advantages: one launch, float64 statistics."""
    global _KERNEL
    if scale not in SCALES:
        raise ValueError(f"scale must be group | batch | none, got {scale!r}")
    if _KERNEL is None:
        _KERNEL = _build_kernel()
    N = rewards.numel()
    adv = torch.empty_like(rewards)
    if N == 0:
        return adv, {"zero_std_frac": 0.0, "group_std_mean": 0.0}
    B = int(group.max()) + 1  # host sync, as in the reference
    mean_g = torch.empty(B, dtype=torch.float64, device=rewards.device)
    std_g = torch.empty_like(mean_g)
    stats = torch.empty(2, dtype=torch.float64, device=rewards.device)
    # one program holds [BLOCK_B, BLOCK_N] fp64 tiles: sizes that fit registers on every card (configs.py)
    _KERNEL[(1,)](rewards.contiguous(), group.contiguous().long(), adv, mean_g, std_g, stats, N, B, float(eps),
                  SCALE=SCALES[scale], BLOCK_N=advantage_block_n(N), BLOCK_B=ADVANTAGE_BLOCK_B,
                  num_warps=ADVANTAGE_WARPS)
    zs, gs = stats.tolist()
    return adv, {"zero_std_frac": zs, "group_std_mean": gs}


def grouped_advantages(rewards, group, scale="group", eps=1e-4, impl="torch"):
    """impl: "torch" (the reference) or "triton"; tinyrl.kernels.grouped_advantages resolves "auto"."""
    if impl == "triton":
        return triton_grouped_advantages(rewards, group, scale, eps)
    return torch_grouped_advantages(rewards, group, scale, eps)
