"""One-step-off rollouts (`rollout.overlap`): the next step's batch is collected while this step's update runs.

    step s:  collect -> wait for the batch sampled during step s-1's update (policy version s-1)
                        hand the adapter (version s) to the rollout copy; start collecting step s+1's batch
             update  -> runs beside that collection
             step s+1 trains on tokens one policy version old: overlap needs rollout.max_staleness >= 1

The rollout side is a second model object that shares every frozen base tensor with the trainer's
(`shared_base_copy`: only the LoRA weights are copied, so the base is held once) and decodes on a
worker thread with the run's engine bound to it (`engine.bound_to`); the trainer's own engine still
serves the held-out evaluations. The adapter is handed over by copying the LoRA tensors before each
collection starts, never while one runs. The collection for step s+1 reads the run's config as it was
when it began (during step s): a monitor action taken at step s reaches the batches from step s+2 on.
What a collection changed (the out-of-memory cap) is handed to the next launch and back to the trainer.

Where this pays: a rollout process or card of its own (verl, AReaL, TRL's AsyncGRPO). Colocated on
one device the two phases share its compute; on a 2-core CPU benchmarks/async_rollout.py measures
it. The transformers engine and the vLLM server engine (`rollout.engine: vllm_server`: the rollout copy's
adapter goes to the server as a version of its own when a collection starts; benchmarks/server_rollout.py);
config resolution refuses the others: a vLLM engine colocated on the trainer's GPU would need its weight sync
moved into the hand-over.

N processes: the collection thread's collectives (the group counts of dynamic sampling, partial rollouts'
decode-step counts, the reward counts) run on a process group of their own (`rollout_dist`, gloo), so they
never interleave with the main thread's (the update's gradient all-reduce) in a different order on two ranks.

Checkpoints: a checkpoint waits for the collection in flight and saves the prompt stream and the
source as they were when it started, so a resumed run collects that batch again.
"""

from __future__ import annotations

import contextlib
import copy
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta

import torch

from tinyrl.distributed import Dist
from tinyrl.errors import PeerLostError
from tinyrl.sources.base import Collected, StepInput, staleness_stats


def shared_base_copy(model):
    """A copy of the (peft) model whose frozen parameters and buffers are the original's tensors."""
    memo = {id(p): p for p in model.parameters() if not p.requires_grad}
    memo.update({id(b): b for b in model.buffers()})
    return copy.deepcopy(model, memo)


class OverlapSource:
    """Wraps a source whose engine samples from a rollout copy; runs it one step ahead on a thread."""

    def __init__(self, inner, prompts, model, rollout_model):
        self.inner, self.prompts, self.model, self.rollout_model = inner, prompts, model, rollout_model
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tinyrl-rollout")
        self.future: Future | None = None
        self.launched: dict | None = None  # the prompt stream and source state when the collection in flight began

    def collect(self, inp: StepInput) -> Collected:
        if self.future is None:  # the first step (or the first after a resume): nothing was collected ahead
            self._launch(inp)
        t0 = time.perf_counter()
        got, gen_s = self.future.result()
        wait = time.perf_counter() - t0
        self.future = None
        if inp.version + 1 < inp.cfg.train.steps:  # the next step's batch, sampled by this adapter (version s)
            self._launch(replace(inp, rollout_prompts=got.rollout_prompts, train_version=inp.version + 1))
        got.stats.update({"rollout_wait_s": wait, "overlap_s": max(gen_s - wait, 0.0)})
        return got

    def _launch(self, inp: StepInput) -> None:
        with torch.no_grad():  # hand the adapter over: the LoRA tensors, copied while no collection runs
            for dst, src in zip(self._trainable(self.rollout_model), self._trainable(self.model)):
                dst.copy_(src)
        self.launched = {"prompts": self.prompts.state_dict(), "source": self.inner.state_dict()}
        self.future = self.pool.submit(self._run, inp)

    def _run(self, inp: StepInput) -> tuple[Collected, float]:
        t0 = time.perf_counter()
        got = self.inner.collect(inp)
        if "staleness_max" not in got.stats:  # a synchronous source: every token sampled by `inp.version`
            got.batch.versions = torch.full_like(got.batch.completion_ids, inp.version)
            got.stats.update(staleness_stats(got.batch, inp.trained_at, inp.cfg.rollout.max_staleness,
                                             self.inner.dist))  # [dist] the collection thread's group
        return got, time.perf_counter() - t0

    @staticmethod
    def _trainable(model):
        return [p for p in model.parameters() if p.requires_grad]

    def settle(self) -> None:
        """Wait for the collection in flight (a checkpoint reads the prompt stream and the source)."""
        if self.future is not None:
            self.future.result()

    def state_dict(self) -> dict:
        self.settle()
        if self.future is None or self.launched is None:
            return {"inner": self.inner.state_dict()}
        return {"inner": self.launched["source"], "prompts": self.launched["prompts"]}

    def load_state_dict(self, state: dict) -> None:
        self.future = None
        self.inner.load_state_dict(state.get("inner", {}))
        if "prompts" in state:  # collect the batch that was in flight at the checkpoint again
            self.prompts.load_state_dict(state["prompts"])


def rollout_dist(dist: Dist, timeout_s: float) -> Dist:
    """`dist`'s processes on a gloo process group of their own, for the collection thread (one process: `dist`).
    Every rank calls this at the same point (it creates a group: a collective)."""
    if dist.world == 1:
        return dist
    import torch.distributed as td

    return GroupDist(dist, td.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s)))


class GroupDist(Dist):
    """The collectives of `Dist`, on one process group (CPU tensors: gloo)."""

    def __init__(self, dist: Dist, group):
        super().__init__(torch.device("cpu"))
        self.rank, self.world, self.local_rank, self.group = dist.rank, dist.world, dist.local_rank, group

    @contextlib.contextmanager
    def _collective(self, what: str):
        try:
            yield
        except RuntimeError as e:  # a peer died or stalled past dist.timeout_s
            raise PeerLostError(f"rank {self.rank} of {self.world}: {what} on the rollout thread failed "
                                f"({str(e).splitlines()[0] if str(e) else type(e).__name__}). Another process of the "
                                f"run died or stalled; its last checkpoint is intact: `tinyrl train --resume RUN_DIR`.") from e

    def _all_reduce(self, t: torch.Tensor, op: str) -> torch.Tensor:
        import torch.distributed as td

        out = t.detach().cpu().clone()
        with self._collective(f"all-reduce ({op})"):
            td.all_reduce(out, op={"sum": td.ReduceOp.SUM, "max": td.ReduceOp.MAX}[op], group=self.group)
        return out.to(t.device)

    def all_gather_object(self, obj) -> list:
        import torch.distributed as td

        out = [None] * self.world
        with self._collective("all-gather"):
            td.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast_object(self, obj, src: int = 0):
        import torch.distributed as td

        box = [obj]
        with self._collective("broadcast"):
            td.broadcast_object_list(box, src=src, group=self.group)
        return box[0]

    def barrier(self) -> None:
        import torch.distributed as td

        with self._collective("barrier"):
            td.barrier(group=self.group)
