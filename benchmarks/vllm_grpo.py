"""GRPO steps with the colocated vLLM engine: rollout speed, sync time, and GPU memory shared vs not.

    python benchmarks/vllm_grpo.py --model Qwen/Qwen2.5-0.5B-Instruct --steps 3          # LoRA, bf16
    python benchmarks/vllm_grpo.py --model Qwen/Qwen2.5-0.5B-Instruct --steps 3 --qlora  # QLoRA

Each configuration runs in its own process (a fresh CUDA context, so peak memory is its own):
  shared    the trainer's frozen base is a view of vLLM's weights (one copy)
  unshared  the same run with sharing off (two copies)
and prints, per configuration: rollout tokens/s inside the GRPO loop vs the same vLLM engine
standalone (one generate on the same prompts, before training), the sync time per step (the
adapter hand-over), and peak GPU memory (device-wide, as nvidia-smi sees it: vLLM's cumem pool
is outside torch's allocator statistics). With --qlora there is no "shared" base to speak of
(nf4 trainer, bf16 vLLM; see tinyrl/rollout/vllm.py), both rows show the two-copy cost.

It drives the same code the CPU tests run (build_trainer, Trainer.train_step, VLLMEngine);
on a CPU it runs too (a smoke check, memory columns empty): --model <dir> --device-check.

    python benchmarks/vllm_grpo.py --smoke [--json F]   # the whole path in seconds, on any machine

--smoke: tiny-arith (float32), 2 steps of 2 prompts x 2, 8 new tokens, on CUDA or CPU. Without vLLM
installed it says so and runs the same loop, standalone generate and table on the hf engine (one mode,
"hf"): the vLLM-only figures (sync time, shared / copied MiB) are left empty, not faked.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# --smoke: the run's sizes (argparse dests); the engine and modes depend on whether vLLM is installed
SMOKE = {"model": "tiny-arith", "dtype": "float32", "steps": 2, "prompts": 2, "G": 2, "max_new_tokens": 8,
         "max_model_len": 256, "micro_batch": 4, "lora_r": 4}


def child(args) -> dict:
    import torch

    from tinyrl.api import build_trainer
    from tinyrl.rollout import engines

    cuda = torch.cuda.is_available()
    peak = [0]

    def sample():  # device-wide bytes in use
        if cuda:
            free, total = torch.cuda.mem_get_info()
            peak[0] = max(peak[0], total - free)

    if args.mode == "unshared":
        from tinyrl.rollout.vllm import VLLMEngine

        engines.ENGINES["vllm"] = lambda m, t, cfg, seed: VLLMEngine.from_run(m, t, cfg, seed=seed, share_weights=False)
    overrides = {
        "model.name": args.model, "model.dtype": args.dtype, "model.load_in_4bit": args.qlora,
        "rollout.engine": args.engine, "rollout.num_generations": args.G, "train.prompts_per_step": args.prompts,
        "rollout.max_new_tokens": args.max_new_tokens, "rollout.max_model_len": args.max_model_len,
        "rollout.gpu_memory_utilization": args.gpu_memory_utilization, "train.steps": args.steps,
        "train.micro_batch_size": args.micro_batch, "train.eval_before_after": False, "log.progress": False,
        "log.run_dir": args.run_dir, "lora.r": args.lora_r, "lora.alpha": 2 * args.lora_r,
    }
    t0 = time.perf_counter()
    trainer = build_trainer(overrides=overrides)
    init_s = time.perf_counter() - t0
    sample()
    eng = trainer.engine

    rows = trainer.prompts.next_batch(args.prompts)  # standalone: the engine alone, same prompts and params
    eng.generate([r["rendered"] for r in rows], n=args.G, params=trainer.sampling)  # warm-up
    t = time.perf_counter()
    batch = eng.generate([r["rendered"] for r in rows], n=args.G, params=trainer.sampling)
    standalone_s = time.perf_counter() - t
    standalone_tok = int(batch.completion_mask.sum())
    sample()

    steps = []
    for _ in range(args.steps):
        m, _ = trainer.train_step()
        sample()
        tokens = m["completion_len"] * args.prompts * args.G
        steps.append({"tokens": tokens, "gen_s": m["gen_time"], "step_s": m["step_time"],
                      "k3": m["rollout_trainer_k3"], "maxdiff": m["rollout_trainer_maxdiff"]})
    syncs = getattr(eng, "sync_times", [])[-args.steps:]  # vLLM's adapter hand-over; the hf engine has none
    share = getattr(eng, "share", None)
    return {
        "mode": args.mode, "engine": args.engine, "qlora": args.qlora, "init_s": round(init_s, 1),
        "standalone_tok_s": round(standalone_tok / standalone_s, 1),
        "loop_tok_s": round(sum(s["tokens"] for s in steps) / sum(s["gen_s"] for s in steps), 1),
        "sync_s_per_step": round(sum(syncs) / len(syncs), 4) if syncs else None,
        "step_s": round(sum(s["step_s"] for s in steps) / len(steps), 2),
        "peak_gpu_gib": round(peak[0] / 2 ** 30, 2) if cuda else None,
        "trainer_peak_alloc_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 2) if cuda else None,
        "shared_mib": round(share.shared_bytes / 2 ** 20, 1) if share else (0.0 if args.engine == "vllm" else None),
        "copied_mib": round(share.copied_bytes / 2 ** 20, 1) if share else None,
        "canary_k3_max": max(s["k3"] for s in steps), "canary_maxdiff_max": max(s["maxdiff"] for s in steps),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--qlora", action="store_true")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    p.add_argument("--run-dir", default=None, help="default runs/bench-vllm (--smoke: a temporary folder)")
    p.add_argument("--modes", default=None, help="default shared,unshared (--smoke without vLLM: hf)")
    p.add_argument("--device-check", action="store_true", help="allow running without CUDA (a smoke check)")
    p.add_argument("--smoke", action="store_true", help="the whole path in seconds on any machine (see above)")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--mode", help=argparse.SUPPRESS)  # set in the child process
    p.add_argument("--engine", default="vllm", help=argparse.SUPPRESS)  # set in the child process
    args = p.parse_args()
    if args.smoke:  # the smoke's sizes over the defaults (the child gets --smoke too, so it sees the same)
        p.set_defaults(**SMOKE)
        args = p.parse_args()
    if args.mode:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return
    import torch

    vllm = importlib.util.find_spec("vllm") is not None
    if args.smoke:
        args.device_check = True
        if not vllm:
            print("smoke: vllm is not installed: the vLLM engine, its weight sharing and its adapter sync are NOT "
                  "measured; the same loop runs on the hf engine (one mode, hf; the vLLM-only columns are empty)")
    if not torch.cuda.is_available() and not args.device_check:
        sys.exit("no CUDA device: this benchmark measures GPU memory and speed (use --device-check to smoke-run on CPU)")
    engine = "vllm" if vllm or not args.smoke else "hf"
    modes = (args.modes or ("shared,unshared" if engine == "vllm" else "hf")).split(",")
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.run_dir or (tmp if args.smoke else "runs/bench-vllm")
        results = [run_mode(mode, engine, run_dir) for mode in modes]
    cols = list(results[0])
    print(" | ".join(cols))
    for r in results:
        print(" | ".join(str(r[c]) for c in cols))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def run_mode(mode: str, engine: str, run_dir: str) -> dict:
    """One configuration in a fresh process (its own CUDA context and peak)."""
    cmd = [sys.executable, __file__, *sys.argv[1:], "--mode", mode, "--engine", engine, "--run-dir", run_dir]
    out = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode or not lines:
        sys.exit(f"{mode} run failed (rc {out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


if __name__ == "__main__":
    main()
