"""Asynchronous rollouts (issue 39), side by side: streaming episodes, partial rollouts, learning.

    python benchmarks/async_rollout.py                           # all parts, seeds 0/1/2
    python benchmarks/async_rollout.py --parts tools --seeds 0   # one part, one seed
    python benchmarks/async_rollout.py --json out.json           # also write every row
    python benchmarks/async_rollout.py --smoke --json out.json   # every part, seed 0, in a minute or two (SMOKE)

Parts (each on this machine's CPU; the tiny models; nothing else should run beside it):

- `tools` (tool latency): tiny_search_cpu's base model, its search tool delayed 0 / 100 / 300 ms
  per call. Rollout wall time of one step's batch (B=8 prompts x G=8), turn-synchronous vs
  streaming (`agent.streaming`), at `agent.tool_workers` 8 (the default) and 64, the same
  prompts and sample streams for both; and whether the two give the same trajectories under
  greedy decoding. Target at 300 ms: streaming >= 1.7x faster.
- `tail` (long tail): a model made here in a minute (`tail_model`: a 4-layer, 256-wide Llama that has
  memorised one answer per prompt letter, 24 characters, and 96 for one letter in ten) trained by
  GRPO on those prompts: mean step time at rollout.max_staleness 1 vs 0. Target >= 1.5x.
- `learn`: tiny_search_cpu and tiny_grpo_cpu (their presets as shipped) synchronous, at max_staleness 1
  (partial rollouts), and at max_staleness 1 with rollout.overlap (one-step-off): held-out score and
  wall time, the same number of trained trajectories (steps x B x G). Target: within 3 points of
  the synchronous arm, in less wall time.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tail reward below is named "benchmarks.async_rollout:tail_reward"

DELAYS = (0.0, 0.1, 0.3)
WORKERS = (8, 64)
TAIL_LETTERS = "ABCDEFGHIJ"  # J asks for the long answer
SHORT, LONG = 24, 96
# --smoke: every part on seed 0, each as small as it goes: tools at one delay and one worker count, one timed
# repeat of a 2 x 2 batch; tail with a 2-layer model memorised for 30 steps, 2 GRPO steps of 4 x 4 (32 tokens)
# per arm; learn with every arm of both presets for 2 steps of 2 x 2, 4 held-out questions
SMOKE = {
    "tools": {"delays": (0.1,), "workers": (8,), "repeats": 1, "prompts": 2, "n": 2},
    "tail": {"steps": 2, "prompts": 4, "n": 4, "max_new_tokens": 32, "model": {"steps": 30, "hidden": 64, "layers": 2}},
    "learn": {"overrides": {"train.steps": 2, "train.prompts_per_step": 2, "rollout.num_generations": 2,
                            "train.micro_batch_size": 4, "data.num_eval": 4}},
}


# --------------------------------------------------------------------------- tools: streaming vs turn-synchronous


class DelayedEnv:
    """The preset's environment, each tool call `delay` seconds slower (a remote search API)."""

    def __init__(self, env, delay: float):
        self.env, self.delay = env, delay

    def step(self, calls):
        time.sleep(self.delay * max(len(calls), 1))
        return self.env.step(calls)


def tools_part(seed: int, delays=DELAYS, workers=WORKERS, repeats: int = 3, prompts: int = 8, n: int = 8) -> list[dict]:
    from tinyrl.api import build_trainer

    pool_sizes = workers
    with tempfile.TemporaryDirectory() as root:
        t = build_trainer("tiny_search_cpu", overrides={"train.seed": seed, "log.run_dir": root, "log.progress": False})
        try:
            eng, base_factory, base_cfg = t.engine, t.engine.env_factory, t.engine.cfg
            rows = t.prompts.next_batch(prompts)
            texts = [r["rendered"] for r in rows]
            out = []
            for delay in delays:
                eng.env_factory = lambda row, d=delay: DelayedEnv(base_factory(row), d)
                for workers in pool_sizes:
                    eng.workers = workers
                    row = {"seed": seed, "delay_ms": int(delay * 1000), "workers": workers}
                    times: dict[str, list[float]] = {"sync": [], "streaming": []}
                    calls: dict[str, list[int]] = {"sync": [], "streaming": []}
                    for rep in range(-1, repeats):  # rep -1 warms up; the arms alternate, so drift hits both
                        for arm in ("sync", "streaming"):
                            eng.cfg = replace(base_cfg, streaming=arm == "streaming")
                            t0 = time.perf_counter()
                            b = eng.generate(texts, n=n, params=replace(t.sampling, stream=1000 * rep), columns=rows)
                            if rep >= 0:
                                times[arm].append(time.perf_counter() - t0)
                                calls[arm].append(sum(x["tool_calls"] for x in b.trajectories))
                    ids = {}
                    for arm in ("sync", "streaming"):
                        row[f"{arm}_s"] = statistics.mean(times[arm])
                        row[f"{arm}_calls"] = statistics.mean(calls[arm])
                        if workers == pool_sizes[0]:
                            eng.cfg = replace(base_cfg, streaming=arm == "streaming")
                            g = eng.generate(texts, n=1, params=t.sampling, columns=rows, greedy=True)
                            ids[arm] = [g.completion_ids[i, :int(g.completion_mask[i].sum())].tolist()
                                        for i in range(g.num_rows)]
                    row["speedup"] = row["sync_s"] / row["streaming_s"]
                    if ids:
                        row["greedy_identical"] = ids["sync"] == ids["streaming"]
                    out.append(row)
                    print(json.dumps(row), flush=True)
            eng.cfg = base_cfg
            return out
        finally:
            t.run.unlock()


# --------------------------------------------------------------------------- tail: partial rollouts vs synchronous


def tail_answers(seed: int = 0) -> dict[str, str]:
    """One fixed answer per prompt letter, the last one 4x longer."""
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz"
    return {c: "".join(rng.choice(alphabet) for _ in range(LONG if c == TAIL_LETTERS[-1] else SHORT))
            for c in TAIL_LETTERS}


def tail_model(out: Path, steps: int = 400, hidden: int = 256, layers: int = 4) -> Path:
    """A small Llama that has memorised `tail_answers`: prompt "C:" -> its answer, then EOS."""
    spec = importlib.util.spec_from_file_location("pretrain_tiny", ROOT / "scripts" / "pretrain_tiny.py")
    pt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pt)
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tok = pt.make_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=256, tie_word_embeddings=True, bos_token_id=None,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    model.generation_config = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    texts = [f"{c}:{a}" for c, a in tail_answers().items()]
    enc = [tok(x, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for x in texts]
    L = max(map(len, enc))
    ids = torch.tensor([e + [tok.pad_token_id] * (L - len(e)) for e in enc])
    labels = ids.masked_fill(ids == tok.pad_token_id, -100)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def tail_reward(prompts, completions, answer, **kw):
    """Share of the memorised answer's characters reproduced in place (a dense signal)."""
    return [sum(a == b for a, b in zip(c, ans)) / len(ans) for c, ans in zip(completions, answer)]


def tail_part(seeds: list[int], steps: int = 20, prompts: int = 8, n: int = 8, max_new_tokens: int = 128,
              model: dict | None = None) -> list[dict]:
    """`model`: tail_model's sizes (default: its own)."""
    import tinyrl

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        model = tail_model(Path(tmp) / "tail-model", **(model or {}))
        data = Path(tmp) / "tail.jsonl"
        rng = random.Random(0)
        answers = tail_answers()
        with data.open("w") as f:
            for _ in range(400):
                c = rng.choice(TAIL_LETTERS)
                f.write(json.dumps({"prompt": f"{c}:", "answer": answers[c]}) + "\n")
        for seed in seeds:
            row = {"seed": seed}
            for k in (0, 1):
                run = tinyrl.train(None, **{
                    "model.name": str(model), "data.dataset": str(data), "data.eval_fraction": 0.05,
                    "reward.functions": ["benchmarks.async_rollout:tail_reward"], "rollout.max_new_tokens": max_new_tokens,
                    "rollout.num_generations": n, "train.prompts_per_step": prompts, "train.steps": steps,
                    "train.micro_batch_size": prompts * n, "train.lr": 1e-3, "train.seed": seed,
                    "train.eval_before_after": False, "rollout.max_staleness": k,
                    "log.run_dir": str(Path(tmp) / "runs"), "log.name": f"tail-{seed}-{k}", "log.progress": False})
                m = run.metrics[1:]  # the first step includes the warm-up
                row[f"k{k}_step_s"] = statistics.mean(x["step_time"] for x in m)
                row[f"k{k}_gen_s"] = statistics.mean(x["gen_time"] for x in m)
                row[f"k{k}_len"] = statistics.mean(x["completion_len"] for x in m)
                if k:
                    row["dropped_groups"] = sum(x.get("stale_dropped_groups", 0) for x in run.metrics)
                    row["staleness_mean"] = statistics.mean(x.get("staleness_mean", 0) for x in m)
            row["speedup"] = row["k0_step_s"] / row["k1_step_s"]
            out.append(row)
            print(json.dumps(row), flush=True)
    return out


# --------------------------------------------------------------------------- learn: held-out score at max_staleness 1


LEARN_ARMS = {"sync": {}, "partial": {"rollout.max_staleness": 1},
              "overlap": {"rollout.max_staleness": 1, "rollout.overlap": True}}


def learn_part(seeds: list[int], presets=("tiny_search_cpu", "tiny_grpo_cpu"), overrides: dict | None = None) -> list[dict]:
    """`overrides`: for every run (the smoke's smaller budget)."""
    import tinyrl

    out = []
    with tempfile.TemporaryDirectory() as root:
        for preset in presets:
            for seed in seeds:
                row = {"preset": preset, "seed": seed}
                for arm, extra in LEARN_ARMS.items():
                    t0 = time.perf_counter()
                    run = tinyrl.train(preset, **{**(overrides or {}), "train.seed": seed, "log.run_dir": root, **extra,
                                                  "log.name": f"{preset}-{seed}-{arm}", "log.progress": False})
                    row[f"{arm}_wall"] = time.perf_counter() - t0
                    row["before"], row[f"{arm}_after"] = run.eval_before, run.eval_after
                    row[f"{arm}_train_s"] = sum(m["step_time"] for m in run.metrics)
                    row[f"{arm}_dropped"] = sum(m.get("stale_dropped_groups", 0) for m in run.metrics)
                    if arm == "overlap":
                        row["overlap_s"] = sum(m.get("overlap_s", 0) for m in run.metrics)
                        row["rollout_wait_s"] = sum(m.get("rollout_wait_s", 0) for m in run.metrics)
                out.append(row)
                print(json.dumps(row), flush=True)
    return out


PARTS = {"tools": lambda seeds, **kw: [r for s in seeds for r in tools_part(s, **kw)], "tail": tail_part,
         "learn": learn_part}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS))
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2 (--smoke: 0)")
    ap.add_argument("--smoke", action="store_true", help="every part, seed 0, as small as it goes (SMOKE)")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(2)
    seeds = args.seeds or ([0] if args.smoke else [0, 1, 2])
    results = {}
    for part in args.parts:
        results[part] = PARTS[part](seeds, **(SMOKE[part] if args.smoke else {}))
        if args.json:  # after each part: a later part's failure keeps the earlier figures
            Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
