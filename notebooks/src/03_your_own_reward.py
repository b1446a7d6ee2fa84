# %% [markdown]
# # Your own reward, and a reward that can be hacked
#
# A reward in tinyrl is a plain Python function with TRL's signature,
# `f(prompts, completions, **dataset_columns) -> list[float | None]`. This notebook writes one,
# plugs it into the embedded default (the shipped tiny arithmetic model), and reads its curve from
# the run folder. Then it trains on a reward that is deliberately easy to game, and shows the
# health monitor catching the model gaming it.
#
# Runs on a CPU (Colab's free runtime is fine); no GPU, no download.

# %% tags=["parameters"]
STEPS = 60  # GRPO steps of the first run (your reward beside the verifier)
HACK_STEPS = 60  # GRPO steps of the second run (the hackable reward alone)
SEED = 0
RUNS_DIR = "runs"
TINYRL_PIP = "tinyrl-rlvr"  # what pip installs on Colab: the package index name, or "git+https://..." of a fork

# %% [markdown]
# ## Install
# On Colab this installs tinyrl from `TINYRL_PIP`. The distribution is `tinyrl-rlvr` (`pip install tinyrl-rlvr`, then `import tinyrl`);
# do not `pip install tinyrl`: that name on the package index is another project. Where tinyrl is
# already installed (a local checkout, CI) nothing happens.

# %%
import importlib.util
import subprocess
import sys

if importlib.util.find_spec("tinyrl") is None:
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", TINYRL_PIP if "://" not in TINYRL_PIP else f"tinyrl-rlvr @ {TINYRL_PIP}"])

# %% [markdown]
# ## Write a reward
# The model answers `37+48=` with a completion such as `85`. Our reward pays for a clean answer: only
# digits, nothing else. It receives every completion of the batch at once (and the dataset's columns
# as keyword arguments, which we ignore) and returns one number per completion. Returning `None` for a
# completion excludes it; a reward that raises is counted and logged, never fatal.

# %%
def digits_only(prompts, completions, **columns):
    """1.0 when the completion is a bare number, else 0.0."""
    return [1.0 if c.strip().isdigit() else 0.0 for c in completions]


print(digits_only(["1+1="] * 3, ["2", "2 apples", ""]))

# %% [markdown]
# ## Plug it in
# A preset's `reward.functions` is a list of `{name, weight}`: `task` is the task's own verifier (the
# exact sum), and any function is named as `module:function`. A function defined in this notebook lives
# in `__main__`. The total reward is the weighted sum; every component is logged on its own as
# `reward/<name>` in `metrics.jsonl`.

# %%
import json

import matplotlib.pyplot as plt

import tinyrl

run = tinyrl.train("tiny_grpo_cpu", **{
    "reward.functions": [{"name": "task", "weight": 1.0}, {"name": "__main__:digits_only", "weight": 0.2}],
    "train.steps": STEPS, "train.seed": SEED, "log.run_dir": RUNS_DIR, "log.name": "own-reward",
    "log.progress": False})
print(f"held-out accuracy: {run.eval_before:.1%} -> {run.eval_after:.1%}")

rows = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
steps = [r["step"] for r in rows]
for key in ["reward/task", "reward/digits_only"]:
    plt.plot(steps, [r[key] for r in rows], label=key)
plt.xlabel("step")
plt.legend()
plt.show()

# %% [markdown]
# ## A reward that can be hacked
# Now a reward that sounds harmless, "prefer short answers", and is trained on alone. The model finds
# the cheap way to please it: shorter and shorter completions, right or not. We keep the verifier in
# the run at weight 0: it does not train the model, but `reward/task` is logged beside the reward that
# does, and it shows what is really happening.

# %%
def brevity(prompts, completions, **columns):
    """Deliberately hackable: the shorter the completion, the higher the reward."""
    return [1.0 / (1 + len(c.strip())) for c in completions]


hacked = tinyrl.train("tiny_grpo_cpu", **{
    "reward.functions": [{"name": "__main__:brevity", "weight": 1.0}, {"name": "task", "weight": 0.0}],
    "train.steps": HACK_STEPS, "train.seed": SEED, "log.run_dir": RUNS_DIR, "log.name": "hacked",
    "log.progress": False, "train.eval_before_after": False})

rows = [json.loads(line) for line in (hacked.path / "metrics.jsonl").read_text().splitlines()]
fig, axes = plt.subplots(1, 2, figsize=(10, 3))
steps = [r["step"] for r in rows]
axes[0].plot(steps, [r["reward_mean"] for r in rows], label="reward trained on (brevity)")
axes[0].plot(steps, [r["reward/task"] for r in rows], label="verifier (weight 0)")
axes[0].legend()
axes[1].plot(steps, [r["completion_len"] for r in rows])
axes[1].set_title("completion length (tokens)")
for ax in axes:
    ax.set_xlabel("step")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## The monitor caught it
# tinyrl's health monitor reads every step's metrics. Completions that get shorter while the reward
# rises is its `length_shortcut` alarm: printed during the run, written to `alarms.jsonl`, and listed
# in the run's `report.txt`. (With `monitor.*` switches some alarms also act on their own; this one
# only tells you, because the fix is in the reward.)

# %%
for alarm in hacked.alarms:
    print(f"step {alarm['step']:>3}  {alarm['name']}: {alarm['evidence']}")
names = {a["name"] for a in hacked.alarms}
assert "length_shortcut" in names, f"the monitor missed the hack; it raised {sorted(names)}"

# %% [markdown]
# The fix is never to silence the alarm: it is a reward that pays only for what you want. Keep the
# verifier in every run (at weight 0 if it is not what you train on), read `samples.jsonl`, and prefer
# rewards that cannot be satisfied without doing the task.
