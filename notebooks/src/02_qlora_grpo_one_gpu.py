# %% [markdown]
# # QLoRA GRPO on one GPU: a Qwen2.5 instruct model on GSM8K math
#
# On a Colab GPU (T4, L4 or A100) this notebook trains Qwen2.5-Instruct (0.5B to 7B) with GRPO on
# GSM8K word problems: the base in 4-bit where the card needs it (QLoRA), LoRA adapters on top,
# rollouts from a colocated vLLM, rewards from a math verifier that compares the `\boxed{}` answer by
# value. First it asks tinyrl's planner which preset and profile fit your card.
#
# Without a GPU (or with `FORCE_CPU = True`) every GPU cell is skipped and the same steps run on the
# shipped tiny arithmetic model with its base in 4-bit: the QLoRA path, in minutes on a CPU.

# %% tags=["parameters"]
MODEL = "qwen2.5-0.5b"  # qwen2.5-0.5b | qwen2.5-1.5b | qwen2.5-3b | qwen2.5-7b
PROFILE = "auto"  # auto (from the card's memory) | 16gb | 24gb | 80gb
STEPS = 100  # GRPO steps on the GPU
CPU_STEPS = 60  # GRPO steps of the CPU stand-in
FORCE_CPU = False
GSM8K_DIR = "gsm8k"
RUNS_DIR = "runs"
TINYRL_PIP = "tinyrl-rlvr"  # what pip installs on Colab: the package index name, or "git+https://..." of a fork

# %% [markdown]
# ## Install
# On Colab: tinyrl from `TINYRL_PIP` with its vLLM, math and torchao (int8 bases) extras, and bitsandbytes for 4-bit bases.
# The distribution is `tinyrl-rlvr` (`pip install tinyrl-rlvr`, then `import tinyrl`); do not `pip install tinyrl`: that name on the package index is another project. Where tinyrl is already installed
# (a local checkout, CI) nothing happens.

# %%
import importlib.util
import subprocess
import sys

import torch

ON_GPU = torch.cuda.is_available() and not FORCE_CPU
if importlib.util.find_spec("tinyrl") is None:
    extras = "[vllm,math,torchao]" if ON_GPU else "[math]"  # torchao: the 7B preset's int8 base (16gb, 24gb)
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", TINYRL_PIP + extras if "://" not in TINYRL_PIP else f"tinyrl-rlvr{extras} @ {TINYRL_PIP}",
                           "bitsandbytes>=0.45"])
print("GPU:", torch.cuda.get_device_name(0) if ON_GPU else "none (the CPU stand-in runs)")

# %% [markdown]
# ## Which preset fits which card
# Each GPU preset carries `profiles:` (16gb, 24gb, 80gb, 8xh100) that set what a card of that size can
# hold: 4-bit base, micro-batch, group size, completion length, vLLM's share of the card. `tinyrl plan`
# estimates the peak memory of a preset on a card from the model's architecture alone (no download)
# and says whether it fits. The table is computed here, not copied.

# %%
from tinyrl.plan_report import run as plan

MODELS = ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b"]
CARDS = {"16gb": "T4 16 GB", "24gb": "L4 24 GB", "80gb": "A100/H100 80 GB"}
print(f"{'preset':<28}" + "".join(f"{label:>18}" for label in CARDS.values()))
for m in MODELS:
    cells = []
    for profile in CARDS:
        p, _ = plan(f"{m}_grpo_math_gpu", [], profile=profile, prompt_len=256, search=False)
        cells.append(f"{p.peak / 2**30:5.1f} GiB {'fits' if p.fits else 'NO':>4}")
    print(f"{m + '_grpo_math_gpu':<28}" + "".join(f"{c:>18}" for c in cells))

# %% [markdown]
# ## The plan for this card
# With `PROFILE = "auto"` the profile is the largest one the card's memory holds.

# %%
if ON_GPU:
    gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    profile = PROFILE if PROFILE != "auto" else ("80gb" if gib > 70 else "24gb" if gib > 20 else "16gb")
    preset = f"{MODEL}_grpo_math_gpu"
    _, text = plan(preset, [], profile=profile)
    print(text)
else:
    profile, preset = None, "tiny_grpo_cpu"
    _, text = plan(preset, ["model.load_in_4bit=true"])  # on the CPU: the host memory is the budget
    print(text)

# %% [markdown]
# ## GSM8K
# The data is not shipped. The `gsm8k` task loads `openai/gsm8k` (config `main`) from the hub through
# `datasets` by itself when `data.task_args.path` is left out (offline, `HF_HUB_OFFLINE=1`: from the cache
# that `hf download openai/gsm8k --repo-type dataset` fills). Here, on a GPU runtime, a local copy goes to
# `GSM8K_DIR` as jsonl, GSM8K's own format (`question`, and an `answer` ending in `#### <number>`), so a
# rerun reads it from disk; any dataset of your own works the same way (`data.dataset`: README).

# %%
from pathlib import Path

if ON_GPU and not (Path(GSM8K_DIR) / "train.jsonl").exists():
    from datasets import load_dataset

    ds = load_dataset("openai/gsm8k", "main")
    Path(GSM8K_DIR).mkdir(exist_ok=True)
    for split in ("train", "test"):
        ds[split].to_json(f"{GSM8K_DIR}/{split}.jsonl")

# %% [markdown]
# ## Train
# One call. On the GPU: the preset with its profile, the data folder, and the step count. On a CPU: the
# shipped tiny model with its base in 4-bit (nf4), LoRA on top: the same QLoRA code path.

# %%
import tinyrl

if ON_GPU:
    run = tinyrl.train(preset, profile=profile, **{"data.task_args.path": GSM8K_DIR, "train.steps": STEPS,
                                                     "log.run_dir": RUNS_DIR, "log.progress": False})
else:
    run = tinyrl.train(preset, **{"model.load_in_4bit": True, "train.steps": CPU_STEPS, "log.run_dir": RUNS_DIR,
                                  "log.progress": False})
print(f"held-out accuracy (greedy): {run.eval_before:.1%} -> {run.eval_after:.1%}   run folder: {run.path}")

# %% [markdown]
# ## Curves
# Reward, the share of groups with no learning signal (all samples right or all wrong), and the mean
# completion length, from the run folder's `metrics.jsonl`.

# %%
import json

import matplotlib.pyplot as plt

rows = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
fig, axes = plt.subplots(1, 3, figsize=(12, 3))
for ax, key in zip(axes, ["reward_mean", "zero_std_frac", "completion_len"]):
    ax.plot([r["step"] for r in rows], [r.get(key) for r in rows])
    ax.set_title(key)
    ax.set_xlabel("step")
plt.tight_layout()
plt.show()
print((run.path / "report.txt").read_text()[:600])

# %% [markdown]
# ## Keep the adapter
# `run.adapter` is a plain peft LoRA adapter folder; on Colab, copy it to Drive or push it to the hub
# with peft's `push_to_hub`. `tinyrl eval PRESET --adapter RUN_FOLDER` scores it again later.

# %%
print(sorted(p.name for p in Path(run.adapter).iterdir()))
