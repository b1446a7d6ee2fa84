"""Where a training step's batch comes from: phases 1-3 of the loop (generate, reward, shape).

Every source has one call, `collect(StepInput) -> Collected`, and reads the run's config from its
input each step (the monitor's patches included); what a collection changes comes back in its result,
for the trainer's state to keep. `make_source` picks one from the config:

- `SyncSource` (sync.py; rollout.max_staleness 0, the default): B prompts x G samples under the
  current adapter; the step waits for its longest group;
- `PartialSource` (partial.py; max_staleness k >= 1): groups decode in a pool that outlives the step,
  a step trains on B groups that completed (partial rollouts with bounded staleness);
- `OverlapSource` (overlap.py; rollout.overlap): either of those a step ahead on a thread.

All reward, shape and filter whole groups the same way, in one loop (base.py: `Shaper`, `gather`), so
a run's rewards and penalties do not depend on which source made its batch. Each runs in N processes (each
rank its whole groups, the counts agreed through collectives; one-step-off's on a process group of its own).
Which combinations run (the hf and vllm_server engines for one-step-off) is decided when the config is resolved
(tinyrl.config.switches), never here.
"""

from __future__ import annotations

from tinyrl.sources.base import Collected, Shaper, StepInput, gather, keep_informative, staleness_stats
from tinyrl.sources.overlap import OverlapSource, rollout_dist, shared_base_copy
from tinyrl.sources.partial import PartialSource
from tinyrl.sources.sync import SyncSource

__all__ = ["Collected", "OverlapSource", "PartialSource", "Shaper", "StepInput", "SyncSource", "gather",
           "keep_informative", "make_source", "shared_base_copy", "staleness_stats"]


def make_source(cfg, engine, prompts, shaper: Shaper, dist, model=None):
    """The run's batch source: synchronous (max_staleness 0), partial rollouts (k >= 1), or one-step-off
    (rollout.overlap): synchronous batches collected a step ahead on a thread (k = 1), a pool of partial
    rollouts collected a step ahead (k >= 2)."""
    r = cfg.rollout
    rollout_model = shared_base_copy(model) if r.overlap else None
    if r.overlap:
        engine = engine.bound_to(rollout_model)
        dist = rollout_dist(dist, cfg.dist.timeout_s)  # [dist] the collection thread's collectives: a group of their own
    # one-step-off spends one version of the staleness budget: its batches train one version late, so a
    # pool of partial rollouts beside it needs max_staleness >= 2 (at 1 every carried group would go stale)
    partial = r.max_staleness > (1 if r.overlap else 0)
    inner = (PartialSource(engine, prompts, shaper, dist, cfg.agent.tool_workers) if partial
             else SyncSource(engine, prompts, shaper, dist))
    return OverlapSource(inner, prompts, model, rollout_model) if r.overlap else inner
