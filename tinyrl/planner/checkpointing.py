"""`model.gradient_checkpointing: auto` (the default): checkpoint only where it pays.

Gradient checkpointing keeps only each decoder layer's input through the update's forward and
recomputes the layer during the backward: the saved activations shrink to about one layer's
worth, and the update does one more forward per micro-batch (about a third more update time). In
tinyrl it also costs the shared prompt: transformers drops a training forward's KV cache under
checkpointing, so every row reads its prompt again. It buys memory and nothing else.

The rule: on exactly when the memory plan of the run (tinyrl.planner, the same one `tinyrl plan`
prints) without checkpointing does not fit the device and its peak is the update phase, the one
checkpointing shrinks. A run that fits stays off (faster); a run whose peak is the rollout or vLLM's
start stays off too (checkpointing would not lower that peak). The device's memory is the card's
(CUDA) or the machine's RAM (CPU). Where the run cannot be planned (an architecture the planner
cannot read), it stays off and says so. `true` / `false` in a preset are used as given.
"""

from __future__ import annotations

import dataclasses
import logging
import os

log = logging.getLogger("tinyrl.planner")


def device_memory(device: str) -> int:
    """Bytes of memory a run on `device` ("cuda" or "cpu") has: this process's card, or the RAM."""
    if device == "cuda":
        import torch

        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    from tinyrl.planner.gpus import host_memory

    return host_memory()


def with_checkpointing(cfg, on: bool):
    """`cfg` with model.gradient_checkpointing set to `on`."""
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, gradient_checkpointing=on))


def checkpointing_pays(cfg, device: str, budget: int, world_size: int = 1,
                       prompt_tokens: int | None = None) -> tuple[bool, str]:
    """The rule above for RunConfig `cfg` on `device` with `budget` bytes: (on, why)."""
    from tinyrl.planner.plan import plan_config

    plan = plan_config(with_checkpointing(cfg, False), device, budget, world_size=world_size,
                       prompt_tokens=prompt_tokens)
    gib = lambda n: f"{n / 2**30:.1f} GiB"  # noqa: E731
    if plan.fits:
        return False, f"the run fits without it (planned peak {gib(plan.peak)} of {gib(budget)})"
    if plan.peak_phase != "update":
        return False, (f"the planned peak ({gib(plan.peak)} of {gib(budget)}) is the {plan.peak_phase} phase, "
                       f"which checkpointing does not lower")
    return True, f"without it the update's planned peak is {gib(plan.peak)} of {gib(budget)}"


def decide(cfg, device: str, budget: int, world_size: int = 1, prompt_tokens: int | None = None):
    """(`cfg` with "auto" decided by the rule, the line that says what and why)."""
    on, why = checkpointing_pays(cfg, device, budget, world_size, prompt_tokens)
    return with_checkpointing(cfg, on), _line(on, why)


def _line(on: bool, why: str) -> str:
    return f"model.gradient_checkpointing auto -> {str(on).lower()}: {why}"


def resolve(cfg, device: str | None = None):
    """`cfg` with model.gradient_checkpointing a bool: "auto" decided by the rule, logged with why."""
    if cfg.model.gradient_checkpointing != "auto":
        return cfg
    import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        cfg, line = decide(cfg, device, device_memory(device), int(os.environ.get("WORLD_SIZE", 1)))
    except Exception as e:  # noqa: BLE001 - an unplannable run trains as it would without the rule
        cfg, line = with_checkpointing(cfg, False), _line(False, f"the run could not be planned ({e})")
    log.info("%s", line)
    return cfg
