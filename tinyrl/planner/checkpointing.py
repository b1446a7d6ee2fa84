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

The rule is `tinyrl.planner.plan.checkpointing_pays`, beside plan_config (which plans "auto" with it,
so `tinyrl plan` shows what a run will do); this module applies it where a run starts (`resolve`, called by
tinyrl.planner.preflight, which also refuses a run that cannot fit).
"""

from __future__ import annotations

import logging
import os

from tinyrl.planner.gpus import host_memory
from tinyrl.planner.plan import checkpointing_line, checkpointing_pays, decide, with_checkpointing

__all__ = ["checkpointing_pays", "decide", "device_memory", "resolve", "with_checkpointing"]
log = logging.getLogger("tinyrl.planner")


def device_memory(device: str) -> int:
    """Bytes of memory a run on `device` ("cuda" or "cpu") has: this process's card, or the RAM."""
    if device == "cuda":
        import torch  # lazy: only a run on a card asks torch; `import tinyrl.planner` stays light

        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return host_memory()


def resolve(cfg, device: str | None = None, prompt_tokens: int | None = None):
    """`cfg` with model.gradient_checkpointing a bool: "auto" decided by the rule, logged with why
    (`prompt_tokens`: the run's measured prompt length; None: the task's typical one)."""
    if cfg.model.gradient_checkpointing != "auto":
        return cfg
    import torch  # lazy, as above

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        cfg, line = decide(cfg, device, device_memory(device), int(os.environ.get("WORLD_SIZE", 1)), prompt_tokens)
    except Exception as e:  # noqa: BLE001 - an unplannable run trains as it would without the rule
        cfg, line = with_checkpointing(cfg, False), checkpointing_line(False, f"the run could not be planned ({e})")
    log.info("%s", line)
    return cfg
