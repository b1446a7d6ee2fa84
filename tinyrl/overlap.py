"""One-step-off rollouts (`rollout.overlap`): the next step's batch is collected while this step's update runs.

    step s:  collect -> wait for the batch sampled during step s-1's update (policy version s-1)
                        hand the adapter (version s) to the rollout copy; start collecting step s+1's batch
             update  -> runs beside that collection
             step s+1 trains on tokens one policy version old: overlap needs rollout.max_staleness >= 1

The rollout side is a second model object that shares every frozen base tensor with the trainer's
(`shared_base_copy`: only the LoRA weights are copied, so the base is held once) and decodes on a
worker thread; the trainer's own engine still serves the held-out evaluations. The adapter is
handed over by copying the LoRA tensors before each collection starts, never while one runs.

Where this pays: a rollout process or card of its own (verl, AReaL, TRL's AsyncGRPO). Colocated on
one device the two phases share its compute; on a 2-core CPU benchmarks/async_rollout.py measures
it. The transformers engine only, for now: a vLLM engine colocated on the trainer's GPU would need
its weight sync moved into the hand-over (refused with a clear message).

Checkpoints: a checkpoint waits for the collection in flight and saves the prompt stream and the
collector as they were when it started, so a resumed run collects that batch again.
"""

from __future__ import annotations

import copy
import time
from concurrent.futures import Future, ThreadPoolExecutor
from types import SimpleNamespace

import torch

from tinyrl.collect import staleness_stats
from tinyrl.errors import ConfigError
from tinyrl.rollout.agent import AgentEngine
from tinyrl.rollout.hf import HFEngine


def shared_base_copy(model):
    """A copy of the (peft) model whose frozen parameters and buffers are the original's tensors."""
    memo = {id(p): p for p in model.parameters() if not p.requires_grad}
    memo.update({id(b): b for b in model.buffers()})
    return copy.deepcopy(model, memo)


def _detach_hf(engine: HFEngine, model) -> HFEngine:
    out = HFEngine(model, engine.tokenizer, seed=engine.seed)
    out.calls = engine.calls
    return out


def _detach_agent(engine: AgentEngine, model) -> AgentEngine:
    out = copy.copy(engine)
    out.inner = detached_engine(engine.inner, model)
    return out


DETACH = {HFEngine: _detach_hf, AgentEngine: _detach_agent}  # exact types: a subclass may hold state of its own


def detached_engine(engine, model):
    """The run's engine, sampling from `model` (the rollout copy) instead of the trainer's model."""
    fn = DETACH.get(type(engine))
    if fn is None:
        raise ConfigError(f"rollout.overlap runs with the hf engine (and agents on it), not {type(engine).__name__}: "
                          "a colocated vLLM engine would need its weight sync inside the hand-over; set "
                          "rollout.overlap: false")
    return fn(engine, model)


class OverlapCollector:
    """Wraps a collector whose engine samples from a rollout copy; runs it one step ahead on a thread."""

    def __init__(self, inner, prompts, model, rollout_model, steps: int, max_staleness: int):
        self.inner, self.prompts, self.model, self.rollout_model = inner, prompts, model, rollout_model
        self.steps, self.k = steps, max_staleness
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tinyrl-rollout")
        self.future: Future | None = None
        self.launched: dict | None = None  # the prompt stream and collector state when the collection in flight began

    def collect(self, state):
        if self.future is None:  # the first step (or the first after a resume): nothing was collected ahead
            self._launch(state.step, state.step, state)
        t0 = time.perf_counter()
        batch, stats, gen_s = self.future.result()
        wait = time.perf_counter() - t0
        self.future = None
        if state.step + 1 < self.steps:  # the next step's batch, sampled by this adapter (version s)
            self._launch(state.step, state.step + 1, state)
        return batch, {**stats, "rollout_wait_s": wait, "overlap_s": max(gen_s - wait, 0.0)}

    def _launch(self, version: int, train_version: int, state) -> None:
        with torch.no_grad():  # hand the adapter over: the LoRA tensors, copied while no collection runs
            for dst, src in zip(self._trainable(self.rollout_model), self._trainable(self.model)):
                dst.copy_(src)
        self.launched = {"prompts": self.prompts.state_dict(), "collector": self.inner.state_dict()}
        view = SimpleNamespace(step=version, rollout_prompts=state.rollout_prompts, oom_retries=state.oom_retries)
        self.future = self.pool.submit(self._run, view, train_version)

    def _run(self, view, train_version: int):
        t0 = time.perf_counter()
        batch, stats = self.inner.collect(view, train_version=train_version)
        if "staleness_max" not in stats:  # a synchronous collector: every token sampled by `view.step`
            batch.versions = torch.full_like(batch.completion_ids, view.step)
            stats = {**stats, **staleness_stats(batch, train_version, self.k)}
        return batch, stats, time.perf_counter() - t0

    @staticmethod
    def _trainable(model):
        return [p for p in model.parameters() if p.requires_grad]

    def settle(self) -> None:
        """Wait for the collection in flight (a checkpoint reads the prompt stream and the collector)."""
        if self.future is not None:
            self.future.result()

    def state_dict(self) -> dict:
        self.settle()
        if self.future is None or self.launched is None:
            return {"inner": self.inner.state_dict()}
        return {"inner": self.launched["collector"], "prompts": self.launched["prompts"]}

    def load_state_dict(self, state: dict) -> None:
        self.future = None
        self.inner.load_state_dict(state.get("inner", {}))
        if "prompts" in state:  # collect the batch that was in flight at the checkpoint again
            self.prompts.load_state_dict(state["prompts"])
