"""Does RL teach a model to search? `tiny_search_cpu` for seeds 0/1/2, and two ablations.

    python benchmarks/search_agent.py                      # 3 seeds x (search agent, mask off, no tool)
    python benchmarks/search_agent.py --preset smollm2-135m_search_cpu --arms agent   # 100 held-out questions (TARGETS)
    python benchmarks/search_agent.py --seeds 0 --arms agent
    python benchmarks/search_agent.py --before-only        # the base model only (greedy held-out EM, searches per question)
    python benchmarks/search_agent.py train.steps=40       # overrides for every arm (before --seeds / --arms)
    python benchmarks/search_agent.py --smoke --json F     # the whole path in about a minute: seed 0, every arm, 2 steps

Targets, every seed, 2 CPU cores (`TARGETS`): tiny_search_cpu (issue 14) held-out EM +25 points or
more in <= 10 minutes; smollm2-135m_search_cpu (issue 50) >= 40% held-out EM on 100 questions in
<= 15 minutes (its SFT cold start and GRPO stage together).
Arms, at the same budget (same preset, steps, batch):

- `agent`: the preset as shipped (observation tokens masked out of the loss);
- `mask_off`: `agent.mask_observations=false`: the loss also trains the observation tokens;
- `no_tool`: `agent.tools=[]`: every `<search>` reaches no tool and gets the fixed line
  `Error: unknown tool. Available tools: none.`; only guessing is left to learn.

Each arm runs through the public API (`tinyrl.train(preset, **overrides)`); wall time counts
all of it (model load, both held-out evaluations, every step, saving). Held-out EM before/after
is the trainer's own evaluation (greedy, multi-turn, the task's EM). Searches per question come
from `tinyrl.evaluate(report=True)` (the same greedy multi-turn evaluation, with its tool-use
report) on the base model and on each arm's adapter, under that arm's own tool setting.
Timings depend on the machine's load: say what else ran.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

PRESET = "tiny_search_cpu"  # --preset
ARMS = {
    "agent": {},
    "mask_off": {"agent.mask_observations": False},
    "no_tool": {"agent.tools": []},
}
# --smoke: seed 0, every arm, 2 steps of 4 prompts x 4, 8 held-out prompts (the target is not judged)
SMOKE = {"train.steps": 2, "train.prompts_per_step": 4, "rollout.num_generations": 4, "train.micro_batch_size": 16,
         "data.num_eval": 8}


@dataclass(frozen=True)
class Target:
    """What every seed's `agent` arm must reach: a gain of `points`, or an EM of `em` (percent), in `seconds`, with
    `overrides` (what the target is judged on, e.g. the number of held-out questions; overrides on the command line win over them)."""
    seconds: float
    points: float | None = None
    em: float | None = None
    overrides: tuple[tuple[str, object], ...] = ()

    def met(self, r: dict) -> bool:
        if r["after"] is None or r["before"] is None or r["wall"] > self.seconds:
            return False
        if self.points is not None and 100 * (r["after"] - r["before"]) < self.points:
            return False
        return self.em is None or 100 * r["after"] >= self.em

    def __str__(self) -> str:
        what = f"+{self.points:.0f} EM points" if self.points is not None else f">= {self.em:.0f}% EM"
        return f"{what} in <= {self.seconds:.0f} s"


TARGETS = {"tiny_search_cpu": Target(600.0, points=25.0),
           "smollm2-135m_search_cpu": Target(900.0, em=40.0, overrides=(("data.num_eval", 100),))}


def tool_use(preset: str, overrides: dict, adapter: str | None = None) -> dict:
    """Greedy held-out EM and tool calls per question of the preset's model (with `adapter`)."""
    import tinyrl

    rep = tinyrl.evaluate(preset, adapter=adapter, report=True, **overrides)
    return {"em": rep.accuracy, "searches": rep.agent.get("tool_calls_per_question", float("nan")),
            "turns": rep.agent.get("turns_per_question", float("nan")),
            "tool_error_rate": rep.agent.get("tool_error_rate", float("nan"))}


def run_arm(preset: str, arm: str, seed: int, extra: dict, root: str) -> dict:
    import tinyrl

    overrides = {**ARMS[arm], "train.seed": seed, "log.run_dir": root, "log.progress": False, **extra}
    t0 = time.perf_counter()
    run = tinyrl.train(preset, **overrides)
    wall = time.perf_counter() - t0
    metrics = run.metrics
    after = tool_use(preset, {k: v for k, v in overrides.items() if not k.startswith("log.")}, adapter=str(run.adapter))
    return {"arm": arm, "seed": seed, "before": run.eval_before, "after": run.eval_after, "wall": wall,
            "steps": len(metrics), "searches_after": after["searches"], "eval_em_after": after["em"],
            "tool_calls_per_traj_last": (metrics[-1].get("tool_calls_per_traj") if metrics else None)}


def table(rows: list[dict], before: dict) -> str:
    lines = [f"{'arm':<9} {'seed':>4} {'EM before':>9} {'EM after':>9} {'change':>7} {'wall s':>7} "
             f"{'searches/q before':>17} {'after':>6}"]
    for r in rows:
        change = 100 * (r["after"] - r["before"]) if r["after"] is not None and r["before"] is not None else float("nan")
        lines.append(f"{r['arm']:<9} {r['seed']:>4} {100 * r['before']:>8.1f}% {100 * r['after']:>8.1f}% "
                     f"{change:>+7.1f} {r['wall']:>7.0f} {before[r['arm']]['searches']:>17.2f} "
                     f"{r['searches_after']:>6.2f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default=PRESET, choices=sorted(TARGETS))
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2 (--smoke: 0)")
    ap.add_argument("--smoke", action="store_true", help="the whole path in about a minute: seed 0, 2 small steps")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--before-only", action="store_true", help="evaluate the base model under each arm; no training")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from tinyrl.config import parse_override

    args.seeds = args.seeds or ([0] if args.smoke else [0, 1, 2])
    judged_on = {} if args.smoke else dict(TARGETS[args.preset].overrides)
    extra = {**judged_on, **(SMOKE if args.smoke else {}),
             **{".".join(k): v for k, v in map(parse_override, args.overrides)}}
    before = {arm: tool_use(args.preset, {**ARMS[arm], **extra}) for arm in args.arms}
    print("base model on the held-out questions (greedy, multi-turn):")
    for arm, m in before.items():
        print(f"  {arm:<9} EM {100 * m['em']:5.1f}%  searches/q {m['searches']:.2f}  turns {m['turns']:.2f}  "
              f"tool errors {m['tool_error_rate']:.2f}")
    if args.before_only:
        return
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for seed in args.seeds:
            for arm in args.arms:
                rows.append(run_arm(args.preset, arm, seed, extra, root))
                print(table(rows[-1:], before).splitlines()[-1], flush=True)
    print("\n" + table(rows, before))
    print("\nside by side (mean over seeds): EM after")
    for arm in args.arms:
        got = [r for r in rows if r["arm"] == arm]
        print(f"  {arm:<9} {100 * sum(r['after'] for r in got) / len(got):5.1f}%  "
              f"(change {100 * sum(r['after'] - r['before'] for r in got) / len(got):+5.1f}, "
              f"searches/q {sum(r['searches_after'] for r in got) / len(got):.2f})")
    agent = [r for r in rows if r["arm"] == "agent"]
    target = TARGETS[args.preset]
    ok = bool(agent) and all(target.met(r) for r in agent)
    print(f"\ntarget for {args.preset} ({target} on {args.threads} threads, every seed): "
          f"{'not judged (--smoke)' if args.smoke else 'met' if ok else 'MISSED'}")
    if args.json is not None:
        args.json.write_text(json.dumps({"before": before, "runs": rows}, indent=2))


if __name__ == "__main__":
    main()
