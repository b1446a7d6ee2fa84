"""Ahead-of-time compile of tinyrl's Triton kernels for named NVIDIA cards, on any machine (no GPU).

    python -m tinyrl.kernels.compile_check            # the table: kernel x card x dtype x config
    python -m tinyrl.kernels.compile_check --json     # the same rows as JSON (tests read these)

Triton compiles a kernel for a target it is told (`GPUTarget("cuda", capability, 32)`) down to a
cubin with the `ptxas` its wheel ships; `ptxas -v`, with exactly the flags Triton gives it, reports
the registers per thread, the bytes spilled to local memory and the shared memory per block.
Every configuration the dispatcher can pick (`tinyrl.kernels.configs`) is compiled for every card
it serves, at every dtype the card runs, and checked against the card:

- shared memory at most the card's per-block limit (opt-in maximum);
- no register spill (`SPILL_BOUND` = 0 bytes): a spill goes through local memory, which is global
  memory; the kernels here are register-bound online softmaxes, and the configurations chosen
  per card do not spill, so any spill is a regression, not a tolerance to tune;
- an occupancy estimate: resident warps per SM out of the maximum, from registers and shared memory.

This module imports Triton (the `kernels` extra) and must run without TRITON_INTERPRET (the
interpreter replaces the compiler): tests run it in a fresh process.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import re
import sys
from dataclasses import asdict, dataclass

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from tinyrl.kernels import configs
from tinyrl.kernels import grouped_advantage as ga
from tinyrl.kernels import triton_logprobs as tk

SPILL_BOUND = 0  # bytes of spill stores or loads a shipped configuration may have (see the docstring)
POINTER = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}


@dataclass(frozen=True)
class Card:
    name: str
    capability: int
    shared_per_block: int  # bytes, the opt-in maximum a block may use
    shared_per_sm: int
    max_warps_per_sm: int
    registers_per_sm: int = 65536


CARDS = {  # CUDA C Programming Guide, "Technical Specifications per Compute Capability"
    75: Card("T4", 75, 64 * 1024, 64 * 1024, 32),
    80: Card("A100", 80, 163 * 1024, 164 * 1024, 64),
    86: Card("3090 / A10", 86, 99 * 1024, 100 * 1024, 48),
    89: Card("4090 / L4", 89, 99 * 1024, 100 * 1024, 48),
    90: Card("H100", 90, 227 * 1024, 228 * 1024, 64),
}


@dataclass
class Row:
    kernel: str
    card: str
    capability: int
    dtype: str
    config: str
    registers: int
    spill_stores: int
    spill_loads: int
    shared: int
    occupancy: float  # resident warps per SM / the SM's maximum
    problems: list[str]


def _signature(kernel: str, fn, pointer: str) -> dict[str, str]:
    """Argument types as the launcher passes them (`pointer`: the hidden states' and weights' dtype)."""
    by_name = {  # the launchers in triton_logprobs.py and grouped_advantage.py
        "logprobs_fwd": {"h_ptr": pointer, "w_ptr": pointer, "b_ptr": pointer, "t_ptr": "*i64", "m_out": "*fp32",
                         "s_out": "*fp32", "w_out": "*fp32", "zt_out": "*fp32", "inv_t": "fp32"},
        "logprobs_dz": {"h_ptr": pointer, "w_ptr": pointer, "b_ptr": pointer, "t_ptr": "*i64", "lse_ptr": "*fp32",
                        "g_ptr": "*fp32", "dz_ptr": pointer, "inv_t": "fp32"},
        "grouped_advantage": {"r_ptr": pointer, "g_ptr": "*i64", "adv_ptr": pointer, "mean_ptr": "*fp64",
                              "std_ptr": "*fp64", "stats_ptr": "*fp64", "eps": "fp32"},
    }[kernel]
    constexprs = {"HAS_BIAS", "IEEE", "SCALE"}
    return {a: by_name.get(a, "constexpr" if a.startswith("BLOCK") or a in constexprs else "i32") for a in fn.arg_names}


@functools.cache
def ga_kernel():
    """The grouped-advantage kernel (built on first use, as its launcher does)."""
    return ga._build_kernel()


def compile_one(kernel: str, fn, pointer: str, constexprs: dict, capability: int, num_warps: int,
                num_stages: int) -> tuple[str, int]:
    """(ptxas -v log, shared bytes) of `fn` compiled for sm_<capability>, Triton's own ptxas call."""
    sig = _signature(kernel, fn, pointer)
    src = ASTSource(fn, sig, {(fn.arg_names.index(k),): v for k, v in constexprs.items()})
    knobs = triton.knobs
    log = io.StringIO()
    with knobs.compilation.scope(), knobs.nvidia.scope():
        knobs.compilation.always_compile = True  # a cache hit would skip ptxas, and its log
        knobs.nvidia.dump_ptxas_log = True
        with contextlib.redirect_stdout(log):
            k = triton.compile(src, target=GPUTarget("cuda", capability, 32),
                               options={"num_warps": num_warps, "num_stages": num_stages})
    return log.getvalue(), k.metadata.shared


def parse_ptxas(log: str) -> tuple[int, int, int]:
    """(registers, spill store bytes, spill load bytes) from a `ptxas -v` log."""
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if regs is None or spill is None:
        raise ValueError(f"cannot read ptxas -v output:\n{log[-2000:]}")
    return int(regs.group(1)), int(spill.group(1)), int(spill.group(2))


def occupancy(card: Card, registers: int, shared: int, num_warps: int) -> float:
    """Resident warps per SM (limited by registers, shared memory and the warp maximum) / the maximum."""
    regs_per_warp = ((registers * 32 + 255) // 256) * 256  # allocation granularity: 256 registers a warp
    blocks = min(card.registers_per_sm // (regs_per_warp * num_warps),
                 card.shared_per_sm // shared if shared else 10**9, card.max_warps_per_sm // num_warps, 32)
    return blocks * num_warps / card.max_warps_per_sm


def check(kernel: str, fn, pointer: str, constexprs: dict, card: Card, blocks: configs.Blocks, dtype: str) -> Row:
    log, shared = compile_one(kernel, fn, pointer, constexprs, card.capability, blocks.warps, blocks.stages)
    regs, st, ld = parse_ptxas(log)
    problems = []
    if shared > card.shared_per_block:
        problems.append(f"shared memory {shared} B > the card's {card.shared_per_block} B per block")
    if max(st, ld) > SPILL_BOUND:
        problems.append(f"spills {st} B stored / {ld} B loaded (bound {SPILL_BOUND} B)")
    return Row(kernel, card.name, card.capability, dtype, blocks.label(), regs, st, ld, shared,
               round(occupancy(card, regs, shared, blocks.warps), 3), problems)


def rows(capabilities=tuple(CARDS)) -> list[Row]:
    """Every kernel x card x dtype x configuration the dispatcher can pick, compiled and checked."""
    out = []
    for cc in capabilities:
        card = CARDS[cc]
        for dtype in configs.dtypes_for(cc):
            for kernel, fn in (("logprobs_fwd", tk._fwd_kernel), ("logprobs_dz", tk._dz_kernel)):
                b = configs.logprob_blocks(kernel, cc, dtype)
                const = {"HAS_BIAS": True, "IEEE": dtype == "fp32", "BLOCK_M": b.m, "BLOCK_V": b.v, "BLOCK_K": b.k}
                out.append(check(kernel, fn, POINTER[dtype], const, card, b, dtype))
        largest = max(configs.advantage_blocks())
        for block_n, block_b in configs.advantage_blocks():
            for scale in (0, 1, 2) if (block_n, block_b) == largest else (1,):  # SCALE: none | group | batch
                b = configs.Blocks(block_n, block_b, 0, configs.ADVANTAGE_WARPS)
                const = {"SCALE": scale, "BLOCK_N": block_n, "BLOCK_B": block_b}
                row = check("grouped_advantage", ga_kernel(), "*fp32", const, card, b, f"fp32 scale={scale}")
                row.config = f"N{block_n} B{block_b} w{configs.ADVANTAGE_WARPS}"
                out.append(row)
    return out


def table(rs: list[Row]) -> str:
    head = f"{'kernel':<18} {'card':<11} {'sm':>3} {'dtype':<14} {'config':<20} {'regs':>4} {'spill st/ld':>12} " \
           f"{'shared':>7} {'occup.':>6}  problems"
    lines = [head, "-" * len(head)]
    for r in rs:
        lines.append(f"{r.kernel:<18} {r.card:<11} {r.capability:>3} {r.dtype:<14} {r.config:<20} {r.registers:>4} "
                     f"{f'{r.spill_stores}/{r.spill_loads}':>12} {r.shared // 1024:>5}Ki {r.occupancy:>6.2f}  "
                     f"{'; '.join(r.problems) or 'ok'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--sm", type=int, nargs="*", default=list(CARDS), help="capabilities (default: every card)")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("compile_check: unset TRITON_INTERPRET (the interpreter replaces the compiler)", file=sys.stderr)
        return 2
    rs = rows(tuple(args.sm))
    print(json.dumps([asdict(r) for r in rs]) if args.json else table(rs))
    return 1 if any(r.problems for r in rs) else 0


if __name__ == "__main__":
    sys.exit(main())
