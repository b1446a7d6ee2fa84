"""The rollout-engine interface, whole: what batch sources, evaluations and checkpoints may use of an
engine, and nothing else of it is read from outside.

`RolloutEngine` is the protocol. `SamplingEngine` is the base of every engine built on
`sample(contexts, params, n, greedy, max_new)` (hf, vllm): it derives `generate` (prompts -> one
`Rollouts`), a decode session (`CallSession`, a `sample` call per step, where the engine has no decode
loop of its own to join), and `episodes` (single-turn trajectories); an engine overrides what it does
better. A tool agent (tinyrl.rollout.agent) implements the same protocol on top of such an engine, so a
batch source never asks which kind of engine it holds.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, ContextManager, Protocol

from tinyrl.rollout.base import Rollouts, Sample, SamplingParams, generate_from_text
from tinyrl.rollout.episodes import PlainTurns, TurnRules
from tinyrl.rollout.session import CallSession, DecodeSession


@dataclass(frozen=True)
class Episodes:
    """How an engine's rollouts advance as trajectories (tinyrl.rollout.episodes): the rules of a turn,
    the engine whose decode session samples the turns, and one turn's sampling parameters."""

    rules: TurnRules  # PlainTurns (single-turn), or the tool agent itself
    sampler: Any  # a RolloutEngine: its `session` decodes the turns
    params: SamplingParams  # a turn's sampling (an agent's also stops at its tool-call tags)


class RolloutEngine(Protocol):
    """What the trainer, the batch sources, the evaluation and the checkpoints need from a generator."""

    tokenizer: Any  # the run's tokenizer: prompts are encoded with it, sampled ids decoded

    def generate(self, prompts: list[str], n: int, params: SamplingParams,
                 columns: list[dict] | None = None, greedy: bool = False) -> Rollouts:
        """n samples of each prompt (prompt-major rows), or the greedy completion when `greedy`."""

    def sample(self, contexts: list[list[int]], params: SamplingParams, n: int = 1, greedy: bool = False,
               max_new: list[int] | None = None) -> list[list[Sample]]:
        """n continuations of each token-id context (the multi-turn agent builds on this); `max_new[i]`
        caps context i's new tokens (default params.max_new_tokens)."""

    def session(self, params: SamplingParams, greedy: bool = False) -> ContextManager[DecodeSession]:
        """A decode session: contexts join and leave a running decode batch (tinyrl.rollout.session)."""

    def episodes(self, params: SamplingParams) -> Episodes:
        """The trajectories this engine's rollouts are made of, for sources that advance them step by step."""

    def bound_to(self, model) -> "RolloutEngine":
        """The same engine (tokenizer, seed, sampling position) sampling from another copy of the policy
        (one-step-off rollouts: tinyrl.sources.overlap)."""

    def release(self) -> None:
        """Free generation memory (KV cache) before the update phase; weights stay."""

    def sync(self, model) -> None:
        """Make the engine sample from the current trained weights (LoRA adapter only)."""

    def state_dict(self) -> dict:
        """The sampling RNG position (saved in checkpoints, so a resumed run draws the same samples)."""

    def load_state_dict(self, state: dict) -> None: ...


class SamplingEngine:
    """The parts of `RolloutEngine` every engine with `sample` derives the same way."""

    tokenizer: Any

    def generate(self, prompts: list[str], n: int, params: SamplingParams,
                 columns: list[dict] | None = None, greedy: bool = False) -> Rollouts:
        return generate_from_text(self, prompts, n, params, columns, greedy)

    def session(self, params: SamplingParams, greedy: bool = False) -> ContextManager[DecodeSession]:
        """No decode loop of its own to join: each step decodes what was queued with `sample` calls."""
        return contextlib.nullcontext(CallSession(self, params, greedy))

    def episodes(self, params: SamplingParams) -> Episodes:
        return Episodes(PlainTurns(self.tokenizer), self, params)

    def bound_to(self, model) -> "RolloutEngine":
        raise NotImplementedError(f"the {type(self).__name__} cannot sample from a second copy of the policy "
                                  "(config resolution refuses rollout.overlap with any engine but hf)")
