"""Scale-out: one process per device computing what one process computes (accelerate underneath).

`setup()` returns the process's `Dist`. Launched by `accelerate launch` or `torchrun` (WORLD_SIZE > 1
in the environment), it builds the process group through accelerate's `PartialState` (NCCL on CUDA,
gloo on CPU) with `train.dist_timeout` as the collective timeout; otherwise it is the one-process
`Dist`, whose collectives return their input. The trainer calls the same methods either way, so its
loop reads the same top-down with one process or eight.

What each rank owns, and what crosses ranks (ARCHITECTURE.md, "Distributed"):

- whole groups: rank r takes the r-th contiguous share of every batch of prompts (`shard`), the
  single-process order split by rank, and samples them on its own colocated engine. A prompt's
  samples are seeded by its position in the run's prompt stream (`SamplingParams.stream`), not by
  the call that draws them, so rank r samples exactly what one process samples for those prompts;
- scalars and statistics: the loss normalisers (tokens, sequences), batch-scaled advantages and
  REINFORCE++ whitening statistics, the no-signal and non-finite decisions, dynamic-sampling
  counts, the top-entropy quantile, the stop request; metrics are computed from every rank's rows
  and are the same on every rank, so the monitor's alarms and auto-actions agree;
- gradients: summed over ranks once per optimiser step (`all_reduce_grads`), trainable (LoRA)
  parameters only; the frozen base (4-bit or float) is a replica on each device. After the step
  every rank holds the same adapter and pushes it into its own engine: no weight traffic.

Why a hand-written gradient all-reduce and not DDP's hooks with `no_sync` on all backwards but
the last (the same communication: one all-reduce of the adapter's gradients per step):

1. exact: each rank's loss is already its share of the global batch loss (the normalisers are
   global sums), so the global gradient is the *sum* of the ranks' gradients; DDP averages;
2. a rank with nothing to train (every one of its groups has zero advantage, so
   `rows_to_compute` is empty) runs no backward at all; under DDP it would need a dummy
   forward-backward through the wrapped module or the others would wait in their last backward
   for ever. Here it adds zeros to the one all-reduce, and ranks with any number of micro-batches
   (0, 1, 5) stay in step;
3. the update runs the decoder trunk and the fused loss directly (`trunk_of`, `output_projection`),
   not the module's forward, which DDP's bookkeeping hangs off;
4. what DDP adds, overlapping bucketed all-reduces with the backward, is worth nothing for
   adapter-sized gradients (tens of MB: milliseconds on NVLink).

Failures: a collective that fails (a peer died: gloo sees the closed connection; a peer stalls
longer than `train.dist_timeout`: the backend's timeout fires) raises `PeerLostError`, which the CLI
prints as one paragraph; the launcher (torchrun's agent) stops the other ranks when one exits.
Checkpoints are written by rank 0 after every rank's RNG and engine state has been gathered, into
a temporary folder renamed at the end, so a failure at any point leaves the last one valid.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import random
from datetime import timedelta

import torch

log = logging.getLogger("tinyrl.distributed")


class PeerLostError(RuntimeError):
    """A collective failed: another process of the run died, or stalled past `train.dist_timeout`."""


def shard(n: int, rank: int, world: int) -> slice:
    """The contiguous share of n items that `rank` of `world` takes (balanced, in rank order).

    >>> [shard(10, r, 4) for r in range(4)]
    [slice(0, 2, None), slice(2, 5, None), slice(5, 7, None), slice(7, 10, None)]
    """
    return slice(rank * n // world, (rank + 1) * n // world)


def launched_world() -> int:
    """Processes the launcher started (WORLD_SIZE; 1 outside accelerate launch / torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


class Dist:
    """One process: every collective returns its input. The multi-process `AccelerateDist` overrides
    the four primitives (`_all_reduce`, `all_gather_object`, `broadcast_object`, `barrier`) and the
    parameter operations; everything else is built on the primitives and is the same code in both."""

    rank, world, local_rank = 0, 1, 0

    def __init__(self, device: torch.device | None = None):
        self.device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ primitives

    def _all_reduce(self, t: torch.Tensor, op: str) -> torch.Tensor:
        return t

    def all_gather_object(self, obj) -> list:
        """Every rank's `obj`, in rank order."""
        return [obj]

    def broadcast_object(self, obj, src: int = 0):
        """Rank `src`'s `obj` on every rank."""
        return obj

    def barrier(self) -> None:
        pass

    def all_reduce_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Sum the gradients of `params` over ranks (a missing gradient counts as zeros)."""

    def broadcast_params(self, params: list[torch.nn.Parameter]) -> None:
        """Overwrite `params` with rank 0's values (every rank starts from the same adapter)."""

    def fork_rng(self, seed: int) -> None:
        """Give ranks other than 0 their own global RNG streams (dropout, reward functions); rank 0
        keeps the stream one process would have."""

    def close(self) -> None:
        pass

    # ------------------------------------------------------------------ built on the primitives

    def all_reduce_sum(self, x):
        """The sum over ranks of a tensor (any device, returned on its own) or a number (as float)."""
        if isinstance(x, torch.Tensor):
            return self._all_reduce(x, "sum")
        return float(self._all_reduce(torch.tensor(float(x), dtype=torch.float64), "sum"))

    def all_reduce_max(self, x: float) -> float:
        return float(self._all_reduce(torch.tensor(float(x), dtype=torch.float64), "max"))

    def any(self, flag: bool) -> bool:
        """True on every rank when it is true on one (a stop request, a non-finite loss)."""
        return self.all_reduce_sum(1.0 if flag else 0.0) > 0

    def share(self, n: int) -> slice:
        """This rank's contiguous share of n items."""
        return shard(n, self.rank, self.world)

    def main_value(self, fn):
        """`fn()` run on rank 0 only (a run-folder write); its result on every rank."""
        return self.broadcast_object(fn() if self.is_main else None)

    def gather_list(self, items: list) -> list:
        """Every rank's list, concatenated in rank order."""
        return [x for part in self.all_gather_object(items) for x in part]

    def sum_dict(self, d: dict[str, float]) -> dict[str, float]:
        """Per-key sums over ranks (a key missing on a rank counts 0); keys in first-seen order."""
        out: dict[str, float] = {}
        for part in self.all_gather_object(d):
            for k, v in part.items():
                out[k] = out.get(k, 0.0) + v
        return out

    def cat(self, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """1-D tensors concatenated over ranks in rank order: what one process holding every rank's
        rows would have. Every rank must pass the same keys."""
        gathered = self.all_gather_object({k: v.detach().cpu() for k, v in parts.items()})
        keys = list(parts)
        for r, g in enumerate(gathered):
            if list(g) != keys:
                raise RuntimeError(f"rank {r} gathered keys {sorted(g)}, rank {self.rank} {sorted(keys)}")
        return {k: torch.cat([g[k] for g in gathered]) for k in keys}


class AccelerateDist(Dist):
    """`world` processes in accelerate's process group (NCCL on CUDA, gloo on CPU)."""

    def __init__(self, state):
        self.state = state
        self.rank, self.world = state.process_index, state.num_processes
        self.local_rank = state.local_process_index
        super().__init__(state.device)

    @contextlib.contextmanager
    def _collective(self, what: str):
        try:
            yield
        except RuntimeError as e:  # torch.distributed.DistBackendError, a closed gloo pair, a timeout
            raise PeerLostError(
                f"rank {self.rank} of {self.world}: {what} failed ({str(e).splitlines()[0] if str(e) else type(e).__name__}). "
                f"Another process of the run died or stalled past train.dist_timeout; the run stopped. Its last "
                f"checkpoint is intact: continue with `tinyrl train --resume RUN_DIR` (same launch command).") from e

    def _all_reduce(self, t: torch.Tensor, op: str) -> torch.Tensor:
        from accelerate.utils import reduce

        with self._collective(f"all-reduce ({op})"):
            return reduce(t.to(self.device), reduction=op).to(t.device)

    def all_gather_object(self, obj) -> list:
        from accelerate.utils import gather_object

        with self._collective("all-gather"):
            return gather_object([obj])

    def broadcast_object(self, obj, src: int = 0):
        from accelerate.utils import broadcast_object_list

        with self._collective("broadcast"):
            return broadcast_object_list([obj], from_process=src)[0]

    def barrier(self) -> None:
        with self._collective("barrier"):
            self.state.wait_for_everyone()

    def all_reduce_grads(self, params: list[torch.nn.Parameter]) -> None:
        if not params:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1).to(torch.float32) for g in grads])  # one all-reduce per step
        flat = self._all_reduce(flat, "sum")
        offset = 0
        for p, g in zip(params, grads):
            n = g.numel()
            p.grad = flat[offset: offset + n].view_as(g).to(p.dtype)
            offset += n

    def broadcast_params(self, params: list[torch.nn.Parameter]) -> None:
        from accelerate.utils import broadcast

        with self._collective("broadcast of the initial adapter"), torch.no_grad():
            for p in params:
                p.copy_(broadcast(p.data.to(self.device), from_process=0).to(p.device))

    def fork_rng(self, seed: int) -> None:
        if self.rank:
            s = int.from_bytes(hashlib.blake2b(f"{seed}/{self.rank}".encode(), digest_size=8).digest(), "little") >> 1
            torch.manual_seed(s)
            random.seed(s)
            import numpy as np

            np.random.seed(s % 2**32)

    def close(self) -> None:
        self.state.destroy_process_group()


_CURRENT: Dist | None = None


def setup(timeout_s: float = 600.0) -> Dist:
    """The process's `Dist` (built once): `AccelerateDist` under a launcher that started several
    processes, else the one-process `Dist`. `timeout_s` bounds every wait on another rank."""
    global _CURRENT
    if _CURRENT is None:
        if launched_world() > 1:
            from accelerate import PartialState

            state = PartialState(cpu=not torch.cuda.is_available(), timeout=timedelta(seconds=timeout_s))
            if state.num_processes < 2:
                raise RuntimeError(f"WORLD_SIZE={launched_world()} but accelerate set up {state.num_processes} process; "
                                   f"launch with --multi_gpu (see docs/scaling.md)")
            _CURRENT = AccelerateDist(state)
            atexit.register(_CURRENT.close)
            log.info("process %d of %d on %s (%s)", _CURRENT.rank, _CURRENT.world, _CURRENT.device, state.backend)
        else:
            _CURRENT = Dist()
    return _CURRENT
