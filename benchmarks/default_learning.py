"""Does the embedded default visibly learn? Runs `tiny_grpo_cpu` and prints a before/after table.

    python benchmarks/default_learning.py [--seeds 0 1 2] [--threads 2] [key=value ...]

Target (issue 2): +15 points or more of held-out greedy accuracy in <= 5 minutes on 2 CPU
cores, reproducible with the seed. Wall time counts everything `tinyrl.train` does for the
run: model load, both held-out evaluations, every step, the checkpoint and adapter save.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import tinyrl
    from tinyrl.config import parse_override

    extra = {".".join(k): v for k, v in map(parse_override, args.overrides)}
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for seed in args.seeds:
            t0 = time.perf_counter()
            run = tinyrl.train("tiny_grpo_cpu", **{"train.seed": seed, "log.run_dir": root, "log.progress": False,
                                                   **extra})
            wall = time.perf_counter() - t0
            steps = len(run.metrics)
            step_t = sorted(m["step_time"] for m in run.metrics)[steps // 2]
            rows.append((seed, run.eval_before, run.eval_after, wall, steps, step_t))
    print(f"\n{'seed':>4} {'before':>8} {'after':>8} {'change':>8} {'wall s':>8} {'steps':>6} {'med step s':>11}")
    for seed, b, a, wall, steps, st in rows:
        print(f"{seed:>4} {100 * b:>7.1f}% {100 * a:>7.1f}% {100 * (a - b):>+7.1f}  {wall:>8.1f} {steps:>6} {st:>11.2f}")
    ok = all(a - b >= 0.15 and wall <= 300 for _, b, a, wall, _, _ in rows)
    print(f"\ntarget (+15 points in <= 300 s on {args.threads} threads): {'met' if ok else 'MISSED'}")


if __name__ == "__main__":
    main()
