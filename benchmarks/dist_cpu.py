"""1 vs N processes on a CPU (gloo): step time per phase of the same run, the same global batch.

    python benchmarks/dist_cpu.py [--preset NAME] [--nproc 1 2] [--steps 6] [--json F] [key=value ...]
    python benchmarks/dist_cpu.py --smoke      # the whole path in about a minute: 1 vs 2 processes, 2 steps

Each case is `tinyrl train PRESET` (default: the embedded tiny_grpo_cpu) in fresh processes (N > 1: `--nproc N`, re-launched
through accelerate); the figures come from each run's metrics.jsonl (rank 0's clocks): median
step time, its rollout part (generate + reward + dynamic-sampling rounds: `gen_time`) and the rest
(reference, advantages, update, re-score, sync, and the cross-process exchanges). The first step
is left out (warm-up). A 2-core machine cannot make 2 processes faster: this shows the overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# --smoke: a smaller global batch (the 2-process run splits its 4 prompts 2 and 2)
SMOKE = ["train.prompts_per_step=4", "rollout.num_generations=4", "train.micro_batch_size=16"]


def run_case(nproc: int, steps: int, extra: list[str], root: Path, preset: str | None = None) -> dict:
    name = f"n{nproc}"
    cmd = [sys.executable, "-m", "tinyrl", "train", *([preset] if preset else []), f"train.steps={steps}", "train.eval_before_after=false",
           "log.progress=false", f"log.run_dir={root}", f"log.name={name}", *extra]
    if nproc > 1:
        cmd += ["--nproc", str(nproc)]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // nproc))}
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    rows = [json.loads(x) for x in (root / name / "metrics.jsonl").read_text().splitlines()][1:]
    step = statistics.median(r["step_time"] for r in rows)
    gen = statistics.median(r["gen_time"] for r in rows)
    return {"nproc": nproc, "processes_seen": rows[0]["processes"], "step_s": step, "rollout_s": gen,
            "rest_s": step - gen, "wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=None, help="default 6 (--smoke: 2; the first is left out)")
    ap.add_argument("--preset", help="a shipped preset (default: the embedded tiny_grpo_cpu)")
    ap.add_argument("--smoke", action="store_true",
                    help="the whole path in about a minute: 2 steps of 4 prompts x 4 on 1 and 2 processes")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    a.steps = a.steps or (2 if a.smoke else 6)
    if a.smoke:  # overrides given beside --smoke come after these, so they win
        a.overrides = [*SMOKE, *a.overrides]
    with tempfile.TemporaryDirectory() as d:
        results = [run_case(n, a.steps, a.overrides, Path(d), a.preset) for n in a.nproc]
    print(f"{'processes':>9} {'step s':>8} {'rollout s':>10} {'rest s':>8} {'wall s':>8}")
    for r in results:
        print(f"{r['processes_seen']:>9} {r['step_s']:8.3f} {r['rollout_s']:10.3f} {r['rest_s']:8.3f} {r['wall_s']:8.1f}")
    print("RESULT " + json.dumps(results))
    if a.json:
        a.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
