"""Does RL with unit-test rewards teach the tiny code model? `tiny_code_cpu` for seeds 0/1/2, and the ablation.

    python benchmarks/code_rl.py                       # 3 seeds x (tests, code_block)
    python benchmarks/code_rl.py --seeds 0 --arms tests
    python benchmarks/code_rl.py train.steps=20        # overrides for every arm
    python benchmarks/code_rl.py --smoke --json F      # the whole path in about a minute: seed 0, both arms, 2 steps

Target (issue 42): held-out greedy pass@1 +20 points or more in <= 10 minutes on 2 CPU cores,
seeds 0/1/2. Arms, at the same budget (same preset, steps, batch):

- `tests`: the preset as shipped: the reward is the share of the row's asserts passed in the sandbox;
- `code_block`: the reward replaced by "the completion has a non-empty fenced code block"
  (`tinyrl.rewards.format:code_block_reward`): the format alone. If the gain came from writing
  code blocks rather than from the tests, this arm would show it too.

Each arm runs through the public API (`tinyrl.train(preset, **overrides)`); wall time counts
all of it (model load, both held-out evaluations, every step, saving). Pass@1 before/after is the
trainer's own held-out evaluation (greedy, the task's all-asserts-pass check, held-out compositions).
The sandbox outcome counts of the last step come from metrics.jsonl. Timings depend on the
machine's load: say what else ran.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

PRESET = "tiny_code_cpu"
ARMS = {
    "tests": {},
    "code_block": {"reward.functions": ["tinyrl.rewards.format:code_block_reward"]},
}
# --smoke: seed 0, every arm, 2 steps of 4 prompts x 4, 8 held-out prompts (the target is not judged)
SMOKE = {"train.steps": 2, "train.prompts_per_step": 4, "rollout.num_generations": 4, "train.micro_batch_size": 16,
         "data.num_eval": 8}
TARGET_POINTS, TARGET_SECONDS = 20.0, 600.0


def run_arm(arm: str, seed: int, extra: dict, root: str) -> dict:
    import tinyrl

    overrides = {**ARMS[arm], "train.seed": seed, "log.run_dir": root, "log.progress": False, **extra}
    t0 = time.perf_counter()
    run = tinyrl.train(PRESET, **overrides)
    wall = time.perf_counter() - t0
    metrics = run.metrics
    last = metrics[-1] if metrics else {}
    outcomes = {k.split("/", 1)[1]: v for k, v in last.items() if k.startswith("sandbox/")}
    return {"arm": arm, "seed": seed, "before": run.eval_before, "after": run.eval_after, "wall": wall,
            "steps": len(metrics), "last_step_sandbox": outcomes,
            "reward_first": metrics[0].get("reward_mean") if metrics else None,
            "reward_last": last.get("reward_mean")}


def table(rows: list[dict]) -> str:
    lines = [f"{'arm':<10} {'seed':>4} {'pass@1 before':>13} {'after':>7} {'change':>7} {'wall s':>7}  last step's sandbox outcomes"]
    for r in rows:
        change = 100 * (r["after"] - r["before"]) if r["after"] is not None and r["before"] is not None else float("nan")
        sb = " ".join(f"{k}={v:g}" for k, v in sorted(r["last_step_sandbox"].items()) if isinstance(v, (int, float)))
        lines.append(f"{r['arm']:<10} {r['seed']:>4} {100 * r['before']:>12.1f}% {100 * r['after']:>6.1f}% "
                     f"{change:>+7.1f} {r['wall']:>7.0f}  {sb}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2 (--smoke: 0)")
    ap.add_argument("--smoke", action="store_true", help="the whole path in about a minute: seed 0, 2 small steps")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from tinyrl.config import parse_override

    args.seeds = args.seeds or ([0] if args.smoke else [0, 1, 2])
    extra = {**(SMOKE if args.smoke else {}), **{".".join(k): v for k, v in map(parse_override, args.overrides)}}
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for seed in args.seeds:
            for arm in args.arms:
                rows.append(run_arm(arm, seed, extra, root))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    print("\n" + table(rows))
    print("\nmean over seeds:")
    for arm in args.arms:
        got = [r for r in rows if r["arm"] == arm]
        print(f"  {arm:<10} pass@1 {100 * sum(r['before'] for r in got) / len(got):5.1f}% -> "
              f"{100 * sum(r['after'] for r in got) / len(got):5.1f}%  "
              f"(change {100 * sum(r['after'] - r['before'] for r in got) / len(got):+5.1f}, "
              f"wall {sum(r['wall'] for r in got) / len(got):.0f} s)")
    tests = [r for r in rows if r["arm"] == "tests"]
    ok = bool(tests) and all(100 * (r["after"] - r["before"]) >= TARGET_POINTS and r["wall"] <= TARGET_SECONDS
                             for r in tests)
    print(f"\ntarget (+{TARGET_POINTS:.0f} pass@1 points in <= {TARGET_SECONDS:.0f} s on {args.threads} threads, "
          f"every seed): {'not judged (--smoke)' if args.smoke else 'met' if ok else 'MISSED'}")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
