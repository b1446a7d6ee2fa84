"""Does a preset visibly learn? Trains it per seed and prints a held-out before/after table.

    python benchmarks/default_learning.py [--preset tiny_grpo_cpu] [--seeds 0 1 2] [--threads 2] [key=value ...]
    python benchmarks/default_learning.py --smoke [--json F]    # the whole path in seconds: 2 steps, 16 held out

Targets, held-out greedy accuracy on 2 CPU cores, reproducible with the seed:
  tiny_grpo_cpu          (the embedded default, issue 2):   +15 points or more in <= 5 min
  smollm2-135m_grpo_cpu  (a real pretrained model, issue 21): +10 points or more in <= 30 min
Wall time counts everything `tinyrl.train` does for the run: model load, both held-out
evaluations, every step, the checkpoint and adapter save.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

# preset -> (minimum gain in accuracy points, wall-time budget in seconds)
TARGETS = {"tiny_grpo_cpu": (15.0, 300.0), "smollm2-135m_grpo_cpu": (10.0, 1800.0)}
# --smoke: the embedded default, one seed, 2 steps, 16 held-out prompts (its target is not judged)
SMOKE = {"train.steps": 2, "data.num_eval": 16}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny_grpo_cpu", choices=sorted(TARGETS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="the whole path in seconds: 2 steps, 16 held-out prompts")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import tinyrl
    from tinyrl.config import parse_override

    extra = {**(SMOKE if args.smoke else {}), **{".".join(k): v for k, v in map(parse_override, args.overrides)}}
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for seed in args.seeds:
            t0 = time.perf_counter()
            run = tinyrl.train(args.preset, **{"train.seed": seed, "log.run_dir": root, "log.progress": False,
                                               **extra})
            wall = time.perf_counter() - t0
            steps = len(run.metrics)
            step_t = sorted(m["step_time"] for m in run.metrics)[steps // 2]
            alarms = sorted({a["name"] for a in run.alarms})
            rows.append((seed, run.eval_before, run.eval_after, wall, steps, step_t, alarms))
            print(f"seed {seed}: {100 * run.eval_before:.1f}% -> {100 * run.eval_after:.1f}% in {wall:.0f} s",
                  flush=True)
    print(f"\n{args.preset}")
    print(f"{'seed':>4} {'before':>8} {'after':>8} {'change':>8} {'wall s':>8} {'steps':>6} {'med step s':>11}  alarms")
    for seed, b, a, wall, steps, st, alarms in rows:
        print(f"{seed:>4} {100 * b:>7.1f}% {100 * a:>7.1f}% {100 * (a - b):>+7.1f}  {wall:>8.1f} {steps:>6} {st:>11.2f}"
              f"  {', '.join(alarms) or '-'}")
    gain, budget = TARGETS[args.preset]
    ok = all(100 * (a - b) >= gain and wall <= budget for _, b, a, wall, *_ in rows)
    verdict = "not judged (--smoke: 2 steps)" if args.smoke else ("met" if ok else "MISSED")
    print(f"\ntarget (+{gain:.0f} points in <= {budget:.0f} s on {args.threads} threads): {verdict}")
    if args.json is not None:
        keys = ("seed", "before", "after", "wall_s", "steps", "median_step_s", "alarms")
        args.json.write_text(json.dumps({"preset": args.preset, "overrides": extra,
                                         "rows": [dict(zip(keys, r)) for r in rows]}, indent=1))


if __name__ == "__main__":
    main()
