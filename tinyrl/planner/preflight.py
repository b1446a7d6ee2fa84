"""Refuse at start what cannot work: the checks a run gets once, where it is resolved.

`check(cfg)` is called by `tinyrl.config.resolve` for the process that will train, after the config
is built and before any run folder exists. It

1. refuses a completion budget beyond the model's context: rollout.max_new_tokens plus the longest
   prompt (measured on the run's own prompts where they and the tokenizer are on disk) must fit
   `max_position_embeddings` of the model's config.json (or the planner's offline table);
2. decides model.gradient_checkpointing `auto` (tinyrl.planner.checkpointing);
3. refuses a GRPO run whose planned peak (the plan `tinyrl plan` prints) is above this device's
   memory (the card, or the machine's RAM on a CPU), naming each field to lower with the largest
   value that fits, unless `train.ignore_memory_plan: true`.

Why at resolution: it is the one call every entry point (CLI, Python API, notebooks, the UI's
subprocess) makes for every method, once per run, before a run folder is made, so a refusal costs
nothing and leaves nothing behind; and the run is planned there already (the gradient-checkpointing
rule reads the model's config.json through `tinyrl.planner.arch`). A method's own build (grpo.build)
would serve one method, after its folder exists. A model the planner cannot read is not checked.
"""

from __future__ import annotations

import logging
import os

from tinyrl.errors import ConfigError
from tinyrl.planner import memory as M
from tinyrl.planner.arch import Arch, resolve_arch
from tinyrl.planner.checkpointing import device_memory
from tinyrl.planner.checkpointing import resolve as decide_checkpointing
from tinyrl.planner.plan import largest, plan_config
from tinyrl.planner.prompts import measure_prompt_tokens

log = logging.getLogger("tinyrl.planner")
# what a plan over budget can lower, in the order the error names them: Setup field -> config field
KNOBS = {"prompts": "train.prompts_per_step", "generations": "rollout.num_generations",
         "new_tokens": "rollout.max_new_tokens", "micro_batch": "train.micro_batch_size"}


def check(cfg, device: str | None = None):
    """`cfg` with its `auto` settings decided, or ConfigError for a run that cannot work (see the module)."""
    import torch  # lazy: `import tinyrl.planner` stays arithmetic

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        arch = resolve_arch(cfg.model.name)
    except ValueError:  # an architecture the planner cannot read: nothing to check against (the rule says so)
        return decide_checkpointing(cfg, device)
    measured = measure_prompt_tokens(cfg)
    check_context(cfg, arch, measured)
    prompt_tokens = measured[0] if measured else None
    cfg = decide_checkpointing(cfg, device, prompt_tokens)
    if "grpo" in (cfg.stages or ["grpo"]):  # the plan is of a GRPO step; SFT and rest_em/star steps differ
        check_memory(cfg, device, prompt_tokens)
    return cfg


def check_context(cfg, arch: Arch, measured: tuple[int, str] | None) -> None:
    """ConfigError when rollout.max_new_tokens plus the longest prompt is beyond the model's context."""
    context = arch.max_positions
    if not context:  # its config.json does not say
        return
    prompt, how = measured or (1, "at least 1 token: the prompts could not be measured offline")
    new = cfg.rollout.max_new_tokens
    if prompt + new > context:
        fits = context - prompt
        hint = f"the largest that fits is {fits}" if fits >= 1 else "no completion fits: the prompts fill it"
        raise ConfigError(
            f"rollout.max_new_tokens: {new} new tokens after a prompt of {prompt} tokens ({how}) need "
            f"{prompt + new} positions, beyond the context of model {cfg.model.name!r} "
            f"(max_position_embeddings {context}, {arch.source}); {hint}")


def check_memory(cfg, device: str, prompt_tokens: int | None) -> None:
    """ConfigError when the run's planned peak is above this device's memory (train.ignore_memory_plan: start)."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    budget = device_memory(device)
    what = "this card's memory" if device == "cuda" else "this machine's RAM"
    try:
        plan = plan_config(cfg, device, budget, what, world, prompt_tokens)
    except Exception as e:  # noqa: BLE001 - a setup the planner cannot model: the run starts as it would have
        log.info("memory plan unavailable (%s): the run is not checked against %s", e, what)
        return
    if plan.fits:
        return
    why = "; ".join(plan.problems) or f"its planned peak, {M.size(plan.peak)} (the {plan.peak_phase} phase), " \
                                       f"is above {what} ({M.size(budget)})"
    if cfg.train.ignore_memory_plan:
        log.warning("the run may not fit: %s; starting anyway (train.ignore_memory_plan)", why)
        return
    raise ConfigError(f"the run does not fit: {why}. {lower_hint(plan, world)}; `tinyrl plan` shows the "
                      f"whole plan. To start it anyway (the plan overestimates your case), set "
                      f"train.ignore_memory_plan=true")


def lower_hint(plan, world: int) -> str:
    """'Lower train.prompts_per_step (the largest that fits: 12), ...': each knob that fits when lowered alone."""
    s, parts = plan.setup, []
    for knob, field in KNOBS.items():
        now = getattr(s, knob)
        best = largest(s, plan.budget, knob, hi=now - 1) if now > (2 if knob == "generations" else 1) else None
        if best is not None and best < now:
            per = world if knob == "prompts" else 1  # the plan is of one process's share of the prompts
            parts.append(f"{field} (now {now * per}, the largest that fits: {best * per})")
    if not parts:
        return ("no single field fits it when lowered alone: load the base in 4-bit (model.load_in_4bit=true), "
                "pick a smaller model or a device with more memory")
    return "Lower " + ", or ".join(parts)
