"""A broken-on-purpose rollout engine that never follows the trained weights (`rollout.engine: stale`).

It exists to test the monitor's stale-weights canary: it samples from a frozen deep copy of the
policy as it was when the run started, and its `sync` does nothing, which is what a rollout
engine whose weight push silently fails looks like (a vLLM adapter that is cached instead of
reloaded, a sync to the wrong model object). Every step after the first then trains on samples
from a policy the trainer no longer has; the canary (`stale_weights`) must stop the run at step 2.
Used by `presets/tiny_stale_weights_cpu.yaml` and `benchmarks/monitor_calibration.py`; never use
it for a real run.
"""

from __future__ import annotations

import copy

from tinyrl.rollout.hf import HFEngine


class StaleEngine(HFEngine):
    """The transformers engine over a frozen copy of the initial policy; `sync` is ignored."""

    def __init__(self, model, tokenizer, seed: int = 0):
        frozen = copy.deepcopy(model)
        frozen.requires_grad_(False)
        super().__init__(frozen, tokenizer, seed=seed)

    def sync(self, model) -> None:
        """The bug on purpose: the trained weights never reach the engine."""

    def bound_to(self, model):
        raise NotImplementedError("the stale engine never follows the policy (config resolution refuses "
                                  "rollout.overlap with it)")
