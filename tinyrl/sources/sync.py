"""The synchronous batch source (rollout.max_staleness 0, the default): B prompts x G samples generated
under the current adapter; the step waits for its longest group."""

from __future__ import annotations

from dataclasses import replace

import torch

from tinyrl.rollout.base import Rollouts
from tinyrl.sources.base import Collected, OomCap, Shaper, StepInput, gather


class SyncSource:
    """B groups generated under the current adapter (tinyrl.sources.base.gather: dynamic-sampling rounds)."""

    def __init__(self, engine, prompts, shaper: Shaper, dist):
        self.engine, self.prompts, self.shaper, self.dist = engine, prompts, shaper, dist

    def collect(self, inp: StepInput) -> Collected:
        G = inp.cfg.rollout.num_generations
        cap = OomCap(inp.rollout_prompts)

        def draw(need: int):
            first, rows = self.prompts.take(need)  # [dist] this rank's share; `first`: its stream position
            if not rows:
                return None
            batch = self.generate(cap, rows, G, stream=first)  # 1
            return batch, self.shaper.reward(batch)  # 2

        batch, stats = gather(inp.cfg, self.dist, self.shaper, draw)  # 3 (and the rounds)
        return Collected(batch, stats, cap.prompts, cap.retries, inp.cfg)

    def generate(self, cap: OomCap, rows: list[dict], n: int, stream: int | None = None) -> Rollouts:
        """n samples of each row's prompt. On an out-of-memory error the prompts go to the engine in
        halves (whole groups each; the cap is returned with the batch and the trainer keeps it for the run)
        and are sampled again. `stream`: the first row's position in the prompt stream, which seeds its
        samples (the same in any split)."""
        sampling = self.shaper.sampling
        at = lambda i: sampling if stream is None else replace(sampling, stream=stream + i)  # noqa: E731
        while True:
            k = cap.prompts or len(rows)
            try:
                parts = [self.engine.generate([r["rendered"] for r in rows[i:i + k]], n=n, params=at(i),
                                              columns=rows[i:i + k]) for i in range(0, len(rows), k)]
                return Rollouts.concat(parts)
            except torch.OutOfMemoryError:
                if k == 1:
                    raise
                cap.halve(k, f"prompts (x {n} samples) per engine call")

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
