"""The memory planner vs measured peaks on CPU: tiny-arith and SmolLM2-135M, LoRA and QLoRA.

    python benchmarks/memory_validation.py                 # all cases, a table + --json
    python benchmarks/memory_validation.py --cases tiny-lora smollm-qlora --steps 2
    python benchmarks/memory_validation.py --smoke --json F     # the whole path in seconds: tiny-lora, 1 step

What is measured, per case, in a fresh process (`--child`):

1. imports, then a warm-up: one full tinyrl step of the same preset on a throwaway model with
   the real model's tokenizer and config but 2 layers of width 64. This pages in the code of
   every op, tokenizer, task and reward the run uses (libtorch's code pages count in RSS),
   so what follows measures data, not code. Then gc + malloc_trim, and the baseline:
   `VmRSS` now.
2. the real trainer is built (model, LoRA, optimizer, prompts); the load itself is not part of
   the comparison: the peak RSS high-water mark (`VmHWM`) is reset (`/proc/self/clear_refs`
   = 5) after it.
3. `--steps` training steps; the HWM is reset when each rollout and each update starts and
   read when it ends, so each phase has its own peak. Reported: max(HWM) - baseline.

The planner's prediction for the same run is `plan.phases` on device "cpu" (no CUDA context,
no slack) with the prompt and completion lengths the run actually had (its widest padded
batch), so the comparison tests the memory model, not a guess of lengths; the worst-case
prediction (every completion to max_new_tokens) is printed beside it. Both count bytes that
the run's tensors occupy in RAM: RSS also holds Python objects the planner does not model
(prompt rows, the tokenizer, metrics), which is why tiny models are the hard case.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MiB = 2**20

CASES = {
    "tiny-lora": {"preset": "tiny_grpo_cpu", "overrides": {}},
    "tiny-qlora": {"preset": "tiny_grpo_cpu", "overrides": {"model.load_in_4bit": True}},
    "tiny-long-lora": {"preset": "tiny_grpo_cpu", "long": True,
                       "overrides": {"rollout.max_new_tokens": 56, "rollout.num_generations": 16,
                                     "train.micro_batch_size": 128, "rollout.temperature": 2.0}},
    "smollm-lora": {"preset": "smollm2-135m_grpo_cpu", "float_copy": True, "overrides": {}},
    "smollm-qlora": {"preset": "smollm2-135m_grpo_cpu", "float_copy": True,
                     "overrides": {"model.load_in_4bit": True}},
}
COMMON = {"train.eval_before_after": False, "log.progress": False, "train.save_every": 0}


# "live": every block >= 64 KiB is its own mmap, unmapped on free, so RSS follows the bytes of live
# tensors (what the planner predicts). "default": glibc as shipped keeps freed heap blocks below its
# (dynamic, up to 32 MiB) mmap threshold, so RSS also carries freed-but-retained memory.
MALLOC_MODES = {"live": {"MALLOC_MMAP_THRESHOLD_": "65536"}, "default": {}}


def spread_reward(prompts, completions, **columns):
    """A dense reward added to every case (weight 0.1): completion length mod 7. With the task's
    reward alone a group can score all alike, and a step without signal runs the update
    without autograd (no saved activations): the peak being measured would not happen."""
    return [len(c) % 7 / 7 for c in completions]


def with_spread(preset: str) -> list[dict]:
    from tinyrl.config import load_config

    _, cfg = load_config(preset)
    fns = [{"name": f.name, "weight": f.weight, "kwargs": f.kwargs} for f in cfg.reward.functions]
    return fns + [{"name": "memory_validation:spread_reward", "weight": 0.1}]


# --------------------------------------------------------------------------- child


def _status(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _trim() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def _warm_model(real: str, root: str) -> str:
    """The real model's tokenizer + config, shrunk to 2 layers of width 64 (random weights)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tinyrl.model import load_tokenizer, resolve_model

    resolved = resolve_model(real)
    cfg = AutoConfig.from_pretrained(resolved.path, gguf_file=resolved.gguf_file)
    heads, kv = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    cfg.update({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2 if kv < heads else 4, "head_dim": 16})
    path = os.path.join(root, "warm")
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    load_tokenizer(resolved).save_pretrained(path)
    return path


def child(spec: dict) -> dict:
    import torch

    import tinyrl.trainer as T
    from tinyrl.api import build_trainer

    torch.manual_seed(0)
    root = tempfile.mkdtemp(prefix="tinyrl-memval-")
    over = {**COMMON, **spec["overrides"], "log.run_dir": os.path.join(root, "runs"),
            "train.steps": spec["steps"]}
    warm = build_trainer(spec["preset"], overrides={**over, "model.name": _warm_model(spec["model"], root),
                                                    "train.steps": 1})
    warm.train_step()
    del warm
    _trim()
    base = _status("VmRSS")
    trainer = build_trainer(spec["preset"], overrides={**over, "model.name": spec["model"]})
    after_init = _status("VmRSS")
    shapes: list[tuple[int, int]] = []
    peaks = {"rollout": 0, "update": 0}

    def phase(name, fn):
        def wrapped(*a, **k):
            _reset_hwm()
            out = fn(*a, **k)
            peaks[name] = max(peaks[name], _status("VmHWM"))
            if name == "rollout":
                shapes.append((out.prompt_ids.shape[1], out.completion_ids.shape[1]))
            return out
        return wrapped

    trainer.source.generate = phase("rollout", trainer.source.generate)  # (tinyrl.sources.SyncSource)
    T.policy_update = phase("update", T.policy_update)
    no_signal = 0
    for _ in range(spec["steps"]):
        no_signal += bool(trainer.train_step()[0]["skipped_no_signal"])
    return {"steps_without_signal": no_signal, "baseline_rss": base, "init_rss": after_init - base,
            "peaks": {k: v - base for k, v in peaks.items()},
            "prompt_tokens": max(p for p, _ in shapes), "completion_tokens": max(t for _, t in shapes),
            "threads": torch.get_num_threads()}


# --------------------------------------------------------------------------- parent


def predict(spec: dict, measured: dict) -> dict:
    from tinyrl.config import load_config
    from tinyrl.planner import build, setup_from_config

    _, cfg = load_config(spec["preset"], {**COMMON, **spec["overrides"], "model.name": spec["model"]})
    worst = setup_from_config(cfg, "cpu", prompt_tokens=measured["prompt_tokens"])
    seen = dataclasses.replace(worst, new_tokens=measured["completion_tokens"])
    p, w = build(seen, 2**40), build(worst, 2**40)
    weights = sum(r.bytes for r in p.rows if r.phase == "always")
    return {"phases": p.phases, "peak": p.allocated_peak, "worst_peak": w.allocated_peak, "persistent": weights}


def run_case(name: str, steps: int, root: str, timeout: int) -> dict:
    spec = {**CASES[name], "steps": steps}
    spec["overrides"] = {**spec["overrides"], "reward.functions": with_spread(spec["preset"])}
    sys.path.insert(0, str(HERE))
    from _bench import float_copy, make_random_llama

    if spec.get("float_copy"):
        spec["model"] = float_copy("smollm2-135m-instruct", root)
    elif spec.get("long"):  # tiny-arith's shape, a model that never emits EOS
        cfg = json.loads((Path(__file__).resolve().parents[1] / "tinyrl/assets/tiny-arith/config.json").read_text())
        spec["model"] = make_random_llama(os.path.join(root, "noeos"), hidden=cfg["hidden_size"],
                                          layers=cfg["num_hidden_layers"], heads=cfg["num_attention_heads"],
                                          no_eos=True)
    else:
        spec["model"] = "tiny-arith"
    runs = {}
    for mode, env in MALLOC_MODES.items():
        out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True,
                             text=True, timeout=timeout, env={**os.environ, **env})
        if out.returncode != 0:
            return {"case": name, "error": out.stderr[-3000:]}
        runs[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    measured = runs["live"]
    pred = predict(spec, measured)
    meas_peak = max(measured["peaks"].values())
    return {"case": name, "model": spec["model"], "measured": measured, "glibc_default": runs["default"],
            "predicted": pred, "error_pct": 100 * (pred["peak"] - meas_peak) / meas_peak}


def table(results: list[dict]) -> str:
    head = (f"{'case':<15} {'P+T':>7} {'persist':>8} {'rollout':>15} {'update':>15} {'peak':>17} {'err':>6}"
            f" {'worst':>7} {'glibc':>7}\n{'':<15} {'':>7} {'pred':>8} {'meas / pred':>15} {'meas / pred':>15}"
            f" {'meas / pred':>17} {'':>6} {'pred':>7} {'default':>7}   (MiB)")
    lines = [head]
    for r in results:
        if "error" in r:
            lines.append(f"{r['case']:<15} ERROR {r['error'].splitlines()[-1] if r['error'] else ''}")
            continue
        m, p = r["measured"], r["predicted"]
        f = lambda a, b: f"{a / MiB:7.1f}/{b / MiB:<7.1f}"  # noqa: E731
        lines.append(f"{r['case']:<15} {m['prompt_tokens']:>3}+{m['completion_tokens']:<3} "
                     f"{p['persistent'] / MiB:8.1f} {f(m['peaks']['rollout'], p['phases']['rollout']):>15} "
                     f"{f(m['peaks']['update'], p['phases']['update']):>15} "
                     f"{f(max(m['peaks'].values()), p['peak']):>17} {r['error_pct']:+5.0f}% "
                     f"{p['worst_peak'] / MiB:7.1f} {max(r['glibc_default']['peaks'].values()) / MiB:7.1f}")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", nargs="*", default=None, choices=list(CASES), help="default: all (--smoke: tiny-lora)")
    ap.add_argument("--steps", type=int, default=None, help="default 2 (--smoke: 1)")
    ap.add_argument("--smoke", action="store_true", help="the whole path in seconds: tiny-lora, 1 step")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    ns.cases = ns.cases or (["tiny-lora"] if ns.smoke else list(CASES))
    ns.steps = ns.steps or (1 if ns.smoke else 2)
    if ns.child:
        print(json.dumps(child(json.loads(ns.child))))
        return []
    root = os.environ.get("TINYRL_BENCH_ROOT") or tempfile.mkdtemp(prefix="tinyrl-memval-")
    results = []
    for name in ns.cases:
        results.append(run_case(name, ns.steps, root, ns.timeout))
        print(table(results[-1:]).splitlines()[-1], flush=True)
    print("\n" + table(results))
    if ns.json:
        Path(ns.json).write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
