"""The memory planner: does a run fit a card, which component costs what, what is the most that fits.

    from tinyrl.planner import plan_config, vllm_settings
    plan = plan_config(cfg, "cuda", 24 * 2**30)
    plan.fits, plan.peak, plan.rows

`tinyrl plan PRESET --gpu 4090` prints the same (tinyrl.plan_report, on the CLI side). The planner is
integer arithmetic on the model's config.json (see memory.py for what each formula counts);
it imports neither torch nor the model. docs/memory.md compares its figures with measurements.
"""

from tinyrl.planner.arch import ARCHITECTURES, Arch, resolve_arch
from tinyrl.planner.gpus import GPUS, PROFILE_GPUS, parse_memory
from tinyrl.planner.memory import Setup, kv_cache_bytes, nf4_bytes
from tinyrl.planner.plan import Plan, build, largest, plan_config, setup_from_config, vllm_settings

__all__ = ["ARCHITECTURES", "Arch", "GPUS", "PROFILE_GPUS", "Plan", "Setup", "build", "kv_cache_bytes", "largest",
           "nf4_bytes", "parse_memory", "plan_config", "resolve_arch", "setup_from_config", "vllm_settings"]
