# %% [markdown]
# # tinyrl quickstart: make a tiny model better at addition with GRPO
#
# This notebook trains the embedded default (`tiny_grpo_cpu`): a 0.5M-parameter Llama shipped inside
# tinyrl that believes, wrongly, that `37+48=75` about two times in three. Reinforcement learning with
# a verifier (the exact sum) teaches it otherwise in well under a minute on a CPU. Then we read the run
# folder, look at samples, evaluate, and load the LoRA adapter back with peft.
#
# Runs on a CPU (Colab's free runtime is fine); no GPU, no download.

# %% tags=["parameters"]
STEPS = 100  # GRPO steps (each: 16 prompts x 8 samples)
SEED = 0
RUNS_DIR = "runs"
TINYRL_PIP = "tinyrl-rlvr"  # what pip installs on Colab: the package index name, or "git+https://..." of a fork

# %% [markdown]
# ## Install
# On Colab this installs tinyrl from `TINYRL_PIP`. The distribution is `tinyrl-rlvr` (`pip install tinyrl-rlvr`, then `import tinyrl`); do not `pip install tinyrl`: that name on the package index is another project. Where tinyrl is already
# installed (a local checkout, CI) nothing happens.

# %%
import importlib.util
import subprocess
import sys

if importlib.util.find_spec("tinyrl") is None:
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", TINYRL_PIP if "://" not in TINYRL_PIP else f"tinyrl-rlvr @ {TINYRL_PIP}"])

# %% [markdown]
# ## Train
# `tinyrl.train` takes a preset name and dotted overrides (the same as `tinyrl train` on the command
# line). It evaluates held-out accuracy (greedy) before and after training.

# %%
import tinyrl

run = tinyrl.train("tiny_grpo_cpu", **{"train.steps": STEPS, "train.seed": SEED, "log.run_dir": RUNS_DIR,
                                        "log.progress": False})
print(f"held-out accuracy: {run.eval_before:.1%} -> {run.eval_after:.1%}   run folder: {run.path}")

# %% [markdown]
# ## Read the run folder
# Every step is one line of `metrics.jsonl`: the reward and each reward component, the token entropy,
# the completion length, the share of groups with no learning signal (`zero_std_frac`) and more.

# %%
import json

import matplotlib.pyplot as plt

rows = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
fig, axes = plt.subplots(1, 3, figsize=(12, 3))
for ax, key in zip(axes, ["reward_mean", "entropy", "completion_len"]):
    ax.plot([r["step"] for r in rows], [r.get(key) for r in rows])
    ax.set_title(key)
    ax.set_xlabel("step")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Samples
# A few completions per step, with their rewards, are in `samples.jsonl`.

# %%
samples = [json.loads(line) for line in (run.path / "samples.jsonl").read_text().splitlines()]
for s in samples[-8:]:
    print(f"step {s['step']:>3}  {s['prompt']}{s['completion']!r:<8} reward {s['reward']}")

# %% [markdown]
# ## Evaluate
# `tinyrl.evaluate` scores the held-out problems with greedy decoding; `adapter=` takes the run folder.
# The alarms the health monitor raised (if any) are in `alarms.jsonl` and `report.txt`.

# %%
acc = tinyrl.evaluate("tiny_grpo_cpu", adapter=run.path)
print(f"held-out greedy accuracy with the trained adapter: {acc:.1%}")
print((run.path / "report.txt").read_text()[:800])

# %% [markdown]
# ## Use the adapter with plain transformers + peft
# The adapter is a standard peft LoRA adapter: load the base model, put the adapter on it, generate.

# %%
from importlib import resources

from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

base_dir = str(resources.files("tinyrl.assets") / "tiny-arith")
tok = AutoTokenizer.from_pretrained(base_dir, padding_side="left")
model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), str(run.adapter)).eval()
prompts = ["37+48=", "56+67=", "19+23="]
enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
out = model.generate(**enc, max_new_tokens=4, do_sample=False, pad_token_id=tok.pad_token_id)
for p, ids in zip(prompts, out[:, enc["input_ids"].shape[1]:]):
    print(p + tok.decode(ids, skip_special_tokens=True))
