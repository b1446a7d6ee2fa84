"""Peak memory and time of one GRPO loss forward+backward from hidden states (not a test).

    python benchmarks/fused_loss.py            # V=151,936 H=896 (Qwen2.5-0.5B), N in 1024 4096 8192
    python benchmarks/fused_loss.py --quick    # V=32,768, N in 512 2048: about a minute on 2 cores
    python benchmarks/fused_loss.py --smoke --json F   # the whole path in seconds: V=4,096 H=128, N=256

Compared, each in a fresh subprocess (so one case's allocator state never leaks into another):
    naive         logits = h W^T materialised, log_softmax, gather, entropy, tinyrl policy_loss
    liger         liger_kernel LigerFusedLinearGRPOLoss (chunked pure torch; compiled=False,
                  beta=0, loss_type="dapo"); it does not return entropies
    ours-torch    tinyrl.kernels.fused_linear_grpo_loss(impl="torch"): chunked, logits recomputed
    ours-triton   the same with impl="triton" (CUDA only)

A case that cannot run here (liger without liger-kernel installed, Triton without CUDA) is listed as
skipped, with the reason, and not run.

Peak memory: on CPU the resident-set high-water mark during the step minus the resident set
just before it (the high-water mark is reset through /proc/self/clear_refs; inputs, weights and
imports are not counted). On CUDA: torch.cuda.max_memory_allocated minus memory allocated
before the step. The lm_head is frozen (the LoRA case) unless --train-lm-head.
On CUDA the table also gives achieved TFLOP/s against a measured bf16 [N, H] x [H, V] matmul;
that path is written but has not been run (the machine it was written on has no GPU).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

IMPLS = ("naive", "liger", "ours-torch", "ours-triton")


def _status_mib(key: str) -> float:
    return int(re.search(key + r":\s+(\d+)", open("/proc/self/status").read()).group(1)) / 1024


def _mem_available_gib() -> float:
    return int(re.search(r"MemAvailable:\s+(\d+)", open("/proc/meminfo").read()).group(1)) / 2**20


def make_inputs(n, vocab, hidden, dtype, device, train_head, seq_len=1024):
    import torch

    g = torch.Generator(device="cpu").manual_seed(0)
    T = min(seq_len, n)
    B = n // T
    h = (torch.randn(B, T, hidden, generator=g) * 0.5).to(device=device, dtype=dtype).requires_grad_()
    w = (torch.randn(vocab, hidden, generator=g) * 0.05).to(device=device, dtype=dtype).requires_grad_(train_head)
    t = torch.randint(0, vocab, (B, T), generator=g).to(device)
    mask = torch.ones(B, T, device=device)
    adv = torch.randn(B, generator=g).to(device)
    old = (-5 + torch.randn(B, T, generator=g)).to(device)
    return dict(h=h, w=w, t=t, mask=mask, adv=adv, old=old)


def step(impl, d, chunk_size):
    """One loss forward + backward."""

    from tinyrl.algo.losses import policy_loss
    from tinyrl.config import AlgoConfig

    if impl == "naive":
        from tinyrl.kernels.torch_logprobs import naive_linear_logprobs

        B, T, H = d["h"].shape
        logp, _ = naive_linear_logprobs(d["h"].reshape(-1, H), d["w"], d["t"].reshape(-1))  # + entropies, as ours
        loss = policy_loss(logp.reshape(B, T), d["old"], d["adv"], d["mask"], AlgoConfig()).loss
    elif impl == "liger":
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

        fn = LigerFusedLinearGRPOLoss(beta=0.0, compiled=False, use_ref_model=False, chunk_size=1,
                                      epsilon_low=0.2, epsilon_high=0.2, loss_type="dapo", temperature=1.0)
        loss = fn(d["h"], d["w"], d["t"], d["mask"], d["adv"], old_per_token_logps=d["old"])[0]
    else:
        from tinyrl.kernels import fused_linear_grpo_loss

        loss = fused_linear_grpo_loss(d["h"], d["w"], d["t"], d["mask"], d["adv"], AlgoConfig(),
                                      old_logp=d["old"], chunk_size=chunk_size, impl=impl.split("-")[1]).loss
    loss.backward()
    return float(loss.detach())


def child(args):
    """Runs one case in this (fresh) process; prints one JSON line."""
    import gc

    import torch

    dtype = getattr(torch, args.dtype)
    if args.case == "matmul":  # bf16 GEMM rate, the yardstick for TFLOP/s
        a = torch.randn(args.n, args.hidden, device=args.device, dtype=dtype)
        b = torch.randn(args.hidden, args.vocab, device=args.device, dtype=dtype)
        for _ in range(3):
            a @ b
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        print(json.dumps({"tflops": 2 * args.n * args.hidden * args.vocab * 10 / (time.perf_counter() - t0) / 1e12}))
        return
    cuda = args.device == "cuda"
    d = make_inputs(args.n, args.vocab, args.hidden, dtype, args.device, args.train_lm_head)
    for _ in range(args.warmup):
        step(args.case, d, args.chunk_size)
        d["h"].grad = d["w"].grad = None
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        open("/proc/self/clear_refs", "w").write("5")  # reset the RSS high-water mark
        base = _status_mib("VmRSS")
    t0 = time.perf_counter()
    loss = step(args.case, d, args.chunk_size)
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else _status_mib("VmHWM") - base
    print(json.dumps({"peak_mib": peak, "time_s": dt, "loss": loss}))


def unavailable(impl: str, cuda: bool) -> str | None:
    """Why `impl` cannot run here, or None."""
    if impl == "liger" and importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel not installed (pip install liger-kernel)"
    if impl == "ours-triton" and not cuda:
        return "needs CUDA"
    return None


def run_case(args, case, n):
    cmd = [sys.executable, __file__, "--_case", case, "--n", str(n), "--vocab", str(args.vocab), "--hidden",
           str(args.hidden), "--dtype", args.dtype, "--device", args.device, "--chunk-size", str(args.chunk_size),
           "--warmup", str(args.warmup)] + (["--train-lm-head"] if args.train_lm_head else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["failed"])[-1][:80]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="V=32768, N in 512 2048")
    p.add_argument("--smoke", action="store_true", help="the whole path in seconds: V=4096, H=128, N=256")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--n", type=int, nargs="+", help="completion tokens per step (default 1024 4096 8192)")
    p.add_argument("--vocab", type=int, default=None)
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--impls", nargs="+", default=None, choices=IMPLS)
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None, help="float32 on CPU, bfloat16 on CUDA by default")
    p.add_argument("--chunk-size", type=int, default=1024, help="rows per chunk of ours-torch")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (CPU 0, CUDA 1: Triton compiles)")
    p.add_argument("--train-lm-head", action="store_true", help="weight requires grad too (default: frozen)")
    p.add_argument("--_case", dest="case", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = args.device == "cuda"
    args.dtype = args.dtype or ("bfloat16" if cuda else "float32")
    args.warmup = (1 if cuda else 0) if args.warmup is None else args.warmup
    if args.smoke:
        args.hidden = 128 if args.hidden == 896 else args.hidden
    args.vocab = args.vocab or (4096 if args.smoke else 32768 if args.quick else 151936)
    if args.case:
        args.n = args.n[0]
        return child(args)
    ns = args.n or ([256] if args.smoke else [512, 2048] if args.quick else [1024, 4096, 8192])
    impls = args.impls or list(IMPLS)
    elt = 2 if args.dtype in ("bfloat16", "float16") else 4
    print(f"V={args.vocab} H={args.hidden} dtype={args.dtype} device={args.device} lm_head "
          f"{'trained' if args.train_lm_head else 'frozen'} warmup={args.warmup} threads={os.cpu_count()}")
    print(f"{'N':>6} {'impl':<12} {'peak MiB':>10} {'time s':>8} {'x naive mem':>11} {'TFLOP/s':>8}  loss")
    gemm = run_case(args, "matmul", max(ns)).get("tflops") if cuda else None
    rows = []
    for impl in impls:
        if unavailable(impl, cuda):
            print(f"{'':>6} {impl:<12} skipped: {unavailable(impl, cuda)}")
    impls = [i for i in impls if not unavailable(i, cuda)]
    for n in ns:
        naive_peak = None
        for impl in impls:
            need_gib = 5 * n * args.vocab * max(elt, 4) / 2**30  # ~5 [N, V] fp32 tensors live at once
            if impl == "naive" and not cuda and need_gib > 0.6 * _mem_available_gib():
                print(f"{n:>6} {impl:<12} skipped: needs ~{need_gib:.0f} GiB, {_mem_available_gib():.0f} available")
                continue
            r = run_case(args, impl, n)
            if "error" in r:
                print(f"{n:>6} {impl:<12} error: {r['error']}")
                continue
            if impl == "naive":
                naive_peak = r["peak_mib"]
            ratio = f"{r['peak_mib'] / naive_peak:.3f}" if naive_peak else "-"
            gemms = 2 + args.train_lm_head + (impl != "naive")  # fwd, grad_h, [grad_W], [recompute]
            tf = 2 * n * args.vocab * args.hidden * gemms / r["time_s"] / 1e12
            print(f"{n:>6} {impl:<12} {r['peak_mib']:>10.0f} {r['time_s']:>8.2f} {ratio:>11} {tf:>8.2f}  "
                  f"{r['loss']:.4f}")
            rows.append({"n": n, "impl": impl, **r, "tflops": tf})
    if gemm:
        print(f"measured bf16 matmul [{max(ns)}, {args.hidden}] x [{args.hidden}, {args.vocab}]: {gemm:.0f} TFLOP/s")
    print("TFLOP/s counts executed GEMM flops (ours and liger recompute the logits in backward).")
    if args.json:
        Path(args.json).write_text(json.dumps({"vocab": args.vocab, "hidden": args.hidden, "dtype": args.dtype,
                                               "device": args.device, "gemm_tflops": gemm, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
