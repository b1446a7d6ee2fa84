"""Does RL teach the tiny model to search? `tiny_search_cpu` for seeds 0/1/2, and two ablations.

    python benchmarks/search_agent.py                      # 3 seeds x (search agent, mask off, no tool)
    python benchmarks/search_agent.py --seeds 0 --arms agent
    python benchmarks/search_agent.py --before-only        # the base model through the probe only
    python benchmarks/search_agent.py train.steps=40       # overrides for every arm

Target (issue 14): held-out EM +25 points or more in <= 10 minutes on 2 CPU cores, seeds 0/1/2.
Arms, at the same budget (same preset, steps, batch):

- `agent`: the preset as shipped (observation tokens masked out of the loss);
- `mask_off`: `agent.mask_observations=false`: the loss also trains the observation tokens;
- `no_tool`: `agent.tools=[]`: every `<search>` reaches no tool and gets the fixed line
  `Error: unknown tool. Available tools: none.`; only guessing is left to learn.

Each arm runs through the public API (`tinyrl.train(preset, **overrides)`); wall time counts
all of it (model load, both held-out evaluations, every step, saving). Held-out EM before/after
is the trainer's own evaluation (greedy, multi-turn, the task's EM). Searches per question come
from the reference probe (`tinyrl.agents.probe`, greedy, same held-out rows) on the base model
and on the trained adapter, under each arm's own tool setting.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

PRESET = "tiny_search_cpu"
ARMS = {
    "agent": {},
    "mask_off": {"agent.mask_observations": False},
    "no_tool": {"agent.tools": []},
}
TARGET_POINTS, TARGET_SECONDS = 25.0, 600.0


def probe_model(overrides: dict, adapter: str | None = None, n: int = 1) -> dict:
    """Greedy EM and searches per question of the preset's model (with `adapter`) on its held-out rows."""
    from tinyrl.agents import build_agent
    from tinyrl.agents.probe import run_episodes, summarize
    from tinyrl.agents.prompts import render_agent_prompt
    from tinyrl.config import load_config
    from tinyrl.data import load_rows
    from tinyrl.model import load_policy

    _, cfg = load_config(PRESET, overrides)
    model, tok = load_policy(cfg.model, cfg.lora, adapter=adapter)
    _, rows, task = load_rows(cfg.data)
    setup = build_agent(cfg.agent, task)
    for r in rows:
        r["rendered"] = render_agent_prompt(tok, r["prompt"], setup.format, setup.toolbox, cfg.data)
    eps = run_episodes(model, tok, rows, setup, n=n, greedy=n == 1, max_turns=cfg.agent.max_turns,
                       max_new_tokens=cfg.rollout.max_new_tokens, max_obs_tokens=cfg.agent.max_obs_tokens,
                       seed=cfg.train.seed)
    return summarize(eps, n)


def run_arm(arm: str, seed: int, extra: dict, root: str) -> dict:
    import tinyrl

    overrides = {**ARMS[arm], "train.seed": seed, "log.run_dir": root, "log.progress": False, **extra}
    t0 = time.perf_counter()
    run = tinyrl.train(PRESET, **overrides)
    wall = time.perf_counter() - t0
    metrics = run.metrics
    after = probe_model({k: v for k, v in overrides.items() if not k.startswith("log.")}, adapter=str(run.adapter))
    return {"arm": arm, "seed": seed, "before": run.eval_before, "after": run.eval_after, "wall": wall,
            "steps": len(metrics), "searches_after": after["searches"], "probe_em_after": after["em"],
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
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--before-only", action="store_true", help="probe the base model under each arm; no training")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from tinyrl.config import parse_override

    extra = {".".join(k): v for k, v in map(parse_override, args.overrides)}
    before = {arm: probe_model({**ARMS[arm], **extra}) for arm in args.arms}
    print("base model on the held-out questions (reference probe, greedy):")
    for arm, m in before.items():
        print(f"  {arm:<9} EM {100 * m['em']:5.1f}%  searches/q {m['searches']:.2f}  turns {m['turns']:.2f}  "
              f"tool errors {m['tool_error_rate']:.2f}")
    if args.before_only:
        return
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for seed in args.seeds:
            for arm in args.arms:
                rows.append(run_arm(arm, seed, extra, root))
                print(table(rows[-1:], before).splitlines()[-1], flush=True)
    print("\n" + table(rows, before))
    print("\nside by side (mean over seeds): EM after")
    for arm in args.arms:
        got = [r for r in rows if r["arm"] == arm]
        print(f"  {arm:<9} {100 * sum(r['after'] for r in got) / len(got):5.1f}%  "
              f"(change {100 * sum(r['after'] - r['before'] for r in got) / len(got):+5.1f}, "
              f"searches/q {sum(r['searches_after'] for r in got) / len(got):.2f})")
    agent = [r for r in rows if r["arm"] == "agent"]
    ok = bool(agent) and all(100 * (r["after"] - r["before"]) >= TARGET_POINTS and r["wall"] <= TARGET_SECONDS
                             for r in agent)
    print(f"\ntarget (+{TARGET_POINTS:.0f} EM points in <= {TARGET_SECONDS:.0f} s on {args.threads} threads, "
          f"every seed): {'met' if ok else 'MISSED'}")
    if args.json is not None:
        args.json.write_text(json.dumps({"before": before, "runs": rows}, indent=2))


if __name__ == "__main__":
    main()
