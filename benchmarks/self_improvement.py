"""GRPO vs ReST-EM vs STaR on the embedded default task, at an equal number of sampled completions.

    python benchmarks/self_improvement.py                    # seeds 0 1 2, 4 points of 1280 samples
    python benchmarks/self_improvement.py --seeds 0 --points 2 --jobs 2 --json /tmp/si.json
    python benchmarks/self_improvement.py --smoke --json F   # the whole path in about a minute (SMOKE)

The budget unit is what GRPO with the default preset (`tiny_grpo_cpu`: 16 prompts x 8
completions per step) samples in 10 steps: 1280 completions. For each seed (`train.seed`:
LoRA init and sampling; prompts and the 200 held-out sums are the same for every run):

- GRPO: `tiny_grpo_cpu` for 10 x points steps, a checkpoint every 10 steps; each
  checkpoint's adapter is evaluated afterwards (held-out greedy pass@1);
- ReST-EM: `tiny_rest_em_cpu` with `points` iterations of 160 prompts x 8 completions;
- STaR: `tiny_star_cpu`, the same, plus the hinted samples for failed prompts, which count
  against its budget: its `samples_used` is printed, a little above the others'.

Each point's accuracy is measured after the method has used that many samples (GRPO: the
checkpoint after that many steps; ReST-EM / STaR: the iterate of that iteration). Every run is
its own process with `--threads` torch threads (default 1: on 2 shared cores two 1-thread
processes beat one 2-thread process many times over); `--jobs` runs that many at once.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

UNIT_STEPS = 10  # a budget point: what GRPO samples in this many steps (tiny_grpo_cpu: 10 x 16 x 8 = 1280)
METHODS = {"grpo": "tiny_grpo_cpu", "rest_em": "tiny_rest_em_cpu", "star": "tiny_star_cpu"}
# --smoke: seed 0, one point of 2 GRPO steps of 4 prompts x 4 (32 samples; ReST-EM / STaR: 8 prompts x 4),
# 16 held-out sums; the overrides go to every method (a section a method does not read is left alone)
SMOKE_STEPS = 2
SMOKE = {"data.num_eval": 16, "train.prompts_per_step": 4, "rollout.num_generations": 4, "train.micro_batch_size": 16,
         "selfimprove.prompts_per_iter": 8, "selfimprove.samples_per_prompt": 4, "sft.batch_size": 8}


def unit(overrides: dict, steps: int = UNIT_STEPS) -> int:
    """Completions per budget point: GRPO's `steps` steps of B x G, read from its resolved config."""
    from tinyrl.config import load_config

    cfg = load_config(METHODS["grpo"], overrides)[1]
    return steps * cfg.train.prompts_per_step * cfg.rollout.num_generations


def child(spec: dict) -> dict:
    """One (method, seed) run in this process; returns {samples: [...], acc: [...], wall_s}."""
    import torch

    torch.set_num_threads(spec["threads"])
    import tinyrl
    from tinyrl.api import evaluate
    from tinyrl.runs import RunDir

    method, seed, points, root = spec["method"], spec["seed"], spec["points"], spec["root"]
    every, extra = spec["steps_per_point"], spec["overrides"]
    common = {**extra, "train.seed": seed, "log.run_dir": root, "log.name": f"{method}-s{seed}", "log.progress": False}
    t0 = time.perf_counter()
    if method == "grpo":
        run = tinyrl.train(METHODS[method], **common, **{"train.steps": every * points, "train.save_every": every,
                                                          "train.keep_last": points + 1})
        acc = [run.eval_before]
        for ckpt in RunDir(run.path).checkpoints():
            acc.append(evaluate(METHODS[method], adapter=str(ckpt / "adapter"), **extra))
        samples = [i * unit(extra, every) for i in range(points + 1)]
    else:
        run = tinyrl.train(METHODS[method], **common, **{"selfimprove.iterations": points})
        rows = [r for r in run.metrics if "iteration" in r]
        acc = [r["eval_acc"] for r in rows]
        samples = [r["samples_used"] for r in rows]
    return {"method": method, "seed": seed, "samples": samples, "acc": acc,
            "wall_s": time.perf_counter() - t0}


def spawn(spec: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{spec['method']} seed {spec['seed']} failed:\n{out.stderr[-3000:]}")


def table(results: list[dict], points: int, per_point: int) -> str:
    head = f"{'method':<8} {'seed':>4} " + " ".join(f"{f'@{i * per_point}':>8}" for i in range(points + 1)) + \
        f" {'samples used':>13} {'wall s':>7}"
    lines = [head, "-" * len(head)]
    for method in METHODS:
        runs = sorted((r for r in results if r["method"] == method), key=lambda r: r["seed"])
        for r in runs:
            accs = " ".join(f"{100 * a:>7.1f}%" for a in r["acc"])
            lines.append(f"{method:<8} {r['seed']:>4} {accs} {r['samples'][-1]:>13} {r['wall_s']:>7.1f}")
        if len(runs) > 1:
            mean = [sum(r["acc"][i] for r in runs) / len(runs) for i in range(points + 1)]
            used = sum(r["samples"][-1] for r in runs) / len(runs)
            lines.append(f"{method:<8} {'mean':>4} " + " ".join(f"{100 * a:>7.1f}%" for a in mean)
                         + f" {used:>13.0f}")
        lines.append("")
    lines.append("held-out greedy pass@1 on the held-out sums after @N sampled completions "
                 "(@0 = the base); STaR's hinted samples count in its budget.")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2 (--smoke: 0)")
    ap.add_argument("--points", type=int, default=None, help="budget points of 1280 samples each (default 4; --smoke: 1)")
    ap.add_argument("--smoke", action="store_true", help="the whole path in about a minute: one small point, seed 0")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (each its own process)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(json.loads(args.child))), flush=True)
        return
    args.seeds = args.seeds or ([0] if args.smoke else [0, 1, 2])
    args.points = args.points or (1 if args.smoke else 4)
    every, extra = (SMOKE_STEPS, SMOKE) if args.smoke else (UNIT_STEPS, {})
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as root:
        specs = [{"method": m, "seed": s, "points": args.points, "threads": args.threads, "root": root,
                  "steps_per_point": every, "overrides": extra} for m in args.methods for s in args.seeds]
        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(spawn, specs))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(table(results, args.points, unit(extra, every)))
    print(f"\ntotal wall time {time.perf_counter() - t0:.0f} s ({args.jobs} job(s) x {args.threads} thread(s))")


if __name__ == "__main__":
    main()
