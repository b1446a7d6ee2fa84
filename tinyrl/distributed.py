"""Scale-out: one process per device computing what one process computes (accelerate underneath).

`setup()` returns the process's `Dist`. Launched by `accelerate launch` or `torchrun` (WORLD_SIZE > 1
in the environment), it builds the process group through accelerate's `PartialState` (NCCL on CUDA,
gloo on CPU) with `dist.timeout_s` as the collective timeout; otherwise it is the one-process `Dist`,
whose collectives return their input. The trainer calls the same methods either way, so its loop
reads the same top-down with one process or eight.

What each rank owns, and what crosses ranks (ARCHITECTURE.md, "Distributed"):

- whole groups: rank r takes the r-th contiguous share of every batch of prompts (`shard`), the
  single-process order split by rank, and samples them on its own colocated engine. A prompt's
  samples are seeded by its position in the run's prompt stream (`SamplingParams.stream`), not by
  the call that draws them, so rank r samples exactly what one process samples for those prompts;
- statistics: the loss normalisers (tokens, sequences), advantages (computed on every rank's
  rewards, `global_advantages`: batch-scaled and whitened estimators see the whole batch), the
  no-signal and non-finite decisions, dynamic-sampling counts, the top-entropy quantile; metrics
  are computed from every rank's rows (`gather_batch`) and are the same on every rank, so the
  monitor's alarms and auto-actions agree;
- gradients: summed over ranks once per optimiser step (`all_reduce_grads`), trainable (LoRA)
  parameters only; the frozen base (4-bit or float) is a replica on each device. After the step
  every rank holds the same adapter and pushes it into its own engine: no weight traffic.

Why one hand-written gradient all-reduce per step and not DDP's hooks with `no_sync` on all
backwards but the last (the same communication: one all-reduce of the adapter's gradients):

1. exact: each rank's loss is already its share of the global batch loss (the normalisers are
   global sums), so the global gradient is the *sum* of the ranks' gradients; DDP averages;
2. a rank with nothing to train (every one of its groups has zero advantage, so
   `rows_to_compute` is empty) runs no backward at all; under DDP it would need a dummy
   forward-backward through the wrapped module or the others would wait in their last backward.
   Here it adds zeros to the one all-reduce, and ranks with any number of micro-batches
   (0, 1, 5) stay in step;
3. the update runs the decoder trunk and the fused loss directly (`trunk_of`, `output_projection`),
   not the module's forward, which DDP's bookkeeping hangs off;
4. what DDP adds, overlapping bucketed all-reduces with the backward, is worth little for
   adapter-sized gradients (tens of MB).

Failures: a collective that fails (a peer died: gloo sees the closed connection; a peer stalls
longer than `dist.timeout_s`: the backend's timeout fires) raises `PeerLostError`, which the CLI
prints as one paragraph; the launcher (torchrun's agent under accelerate) stops the other ranks
when one exits. Checkpoints are written by rank 0 (with every rank's RNG state) into a temporary
folder renamed at the end (tinyrl.runs), so a failure at any point leaves the last one valid.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from datetime import timedelta
from importlib import resources

import torch

from tinyrl.errors import ConfigError, PeerLostError
from tinyrl.rollout.base import Rollouts
from tinyrl.runs import CKPT_PREFIX, RunDir

log = logging.getLogger("tinyrl.distributed")

# Packaged accelerate configs (tinyrl/assets/accelerate/<name>.yaml), for `--nproc N` and the README.
ACCELERATE_CONFIGS = {
    "ddp": "one process per GPU, the base replicated, gradients of the LoRA adapter all-reduced (default)",
    "zero3": "DeepSpeed ZeRO-3: base parameters sharded over GPUs (bases that do not fit one card)",
    "fsdp2": "PyTorch FSDP2: base parameters sharded over GPUs (bases that do not fit one card)",
}
SHARDED = ("zero3", "fsdp2")


def shard(n: int, rank: int, world: int) -> slice:
    """The contiguous share of n items that `rank` of `world` takes (balanced, in rank order).

    >>> [shard(10, r, 4) for r in range(4)]
    [slice(0, 2, None), slice(2, 5, None), slice(5, 7, None), slice(7, 10, None)]
    """
    return slice(rank * n // world, (rank + 1) * n // world)


def launched_world() -> int:
    """Processes the launcher started (WORLD_SIZE; 1 outside accelerate launch / torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def accelerate_config_path(name: str) -> str:
    """The packaged accelerate config file `name` (ddp | zero3 | fsdp2)."""
    if name not in ACCELERATE_CONFIGS:
        raise ConfigError(f"dist.accelerate_config: must be one of {sorted(ACCELERATE_CONFIGS)}, got {name!r}")
    return str(resources.files("tinyrl.assets") / "accelerate" / f"{name}.yaml")


def rendezvous_port() -> int:
    """The port the launched processes meet on: MASTER_PORT when set, else one free now. (accelerate's default,
    29500, made a second multi-process run on the same machine fail with "address already in use".)"""
    if os.environ.get("MASTER_PORT", "").isdigit():
        return int(os.environ["MASTER_PORT"])
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(nproc: int, config_name: str, tinyrl_args: list[str], cpu: bool | None = None) -> list[str]:
    """The `accelerate launch` command that runs `tinyrl <tinyrl_args>` in `nproc` processes.

    On a machine without CUDA it asks for gloo processes on the CPU: `--multi_gpu` with
    `--num_processes` (accelerate's `--cpu --num_processes N` starts one process, not N), and the
    trainer then builds its state with `cpu=True`."""
    cpu = (not torch.cuda.is_available()) if cpu is None else cpu
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", accelerate_config_path(config_name),
           "--num_processes", str(nproc), "--num_machines", "1", "--main_process_port", str(rendezvous_port())]
    if cpu:
        cmd += ["--multi_gpu", "--mixed_precision", "no", "--dynamo_backend", "no"]
    return cmd + ["-m", "tinyrl", *tinyrl_args]


class Dist:
    """One process: every collective returns its input. The multi-process `AccelerateDist` overrides
    the primitives (`_all_reduce`, `all_gather_object`, `broadcast_object`, `barrier`) and the
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

    def close(self) -> None:
        pass

    # ------------------------------------------------------------------ built on the primitives

    def all_reduce_sum(self, x) -> float:
        """The sum over ranks of a number."""
        return float(self._all_reduce(torch.tensor(float(x), dtype=torch.float64), "sum"))

    def any(self, flag: bool) -> bool:
        """True on every rank when it is true on one (a non-finite loss, a stop request)."""
        return self.all_reduce_sum(1.0 if flag else 0.0) > 0

    def share(self, n: int) -> slice:
        """This rank's contiguous share of n items."""
        return shard(n, self.rank, self.world)

    def main_value(self, fn):
        """`fn()` run on rank 0 only (a run-folder write); its result, or its error, on every rank."""
        value, error = None, None
        if self.is_main:
            try:
                value = fn()
            except BaseException as e:  # the others must not wait for a value that never comes
                error = e
        ok, value = self.broadcast_object((error is None, value if error is None else f"{type(error).__name__}: {error}"))
        if error is not None:
            raise error
        if not ok:
            raise RuntimeError(f"rank 0 failed: {value}")
        return value


class AccelerateDist(Dist):
    """`world` processes in accelerate's process group (NCCL on CUDA, gloo on CPU)."""

    def __init__(self, state):
        self.state = state
        self.rank, self.world = state.process_index, state.num_processes
        self.local_rank = state.local_process_index
        super().__init__(state.device)
        # gloo moves CPU tensors, NCCL device tensors: collectives of CPU values go through this device
        self.comm_device = torch.device("cpu") if state.backend == "gloo" else self.device

    @contextlib.contextmanager
    def _collective(self, what: str):
        try:
            yield
        except RuntimeError as e:  # torch.distributed.DistBackendError, a closed gloo pair, a timeout
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise PeerLostError(
                f"rank {self.rank} of {self.world}: {what} failed ({first}). Another process of the run died or "
                f"stalled past dist.timeout_s; the run stopped. Its last checkpoint is intact: continue with "
                f"`tinyrl train --resume RUN_DIR` (the same launch command).") from e

    def _all_reduce(self, t: torch.Tensor, op: str) -> torch.Tensor:
        import torch.distributed as td

        out = t.to(self.comm_device).clone()
        with self._collective(f"all-reduce ({op})"):
            td.all_reduce(out, op={"sum": td.ReduceOp.SUM, "max": td.ReduceOp.MAX}[op])
        return out.to(t.device)

    def all_gather_object(self, obj) -> list:
        import torch.distributed as td

        out = [None] * self.world
        with self._collective("all-gather"):
            td.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj, src: int = 0):
        import torch.distributed as td

        box = [obj]
        with self._collective("broadcast"):
            td.broadcast_object_list(box, src=src)
        return box[0]

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
        import torch.distributed as td

        with self._collective("broadcast of the initial adapter"), torch.no_grad():
            for p in params:
                t = p.data.to(self.comm_device).clone()
                td.broadcast(t, src=0)
                p.copy_(t.to(p.device))

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

            for flag, name in (("ACCELERATE_USE_DEEPSPEED", "zero3"), ("ACCELERATE_USE_FSDP", "fsdp2")):
                if os.environ.get(flag, "false").lower() == "true":
                    raise ConfigError(f"dist.accelerate_config: {name} (sharded base) is shipped as a launch config "
                                      f"but the trainer does not shard the base yet; use ddp")
            state = PartialState(cpu=not torch.cuda.is_available(), timeout=timedelta(seconds=timeout_s))
            if state.num_processes < 2:
                raise RuntimeError(f"WORLD_SIZE={launched_world()} but accelerate set up {state.num_processes} "
                                   f"process; launch with --multi_gpu (README, 'Scale out')")
            _CURRENT = AccelerateDist(state)
            log.info("process %d of %d on %s (%s)", _CURRENT.rank, _CURRENT.world, _CURRENT.device, state.backend)
        else:
            _CURRENT = Dist()
    return _CURRENT


def shutdown() -> None:
    """End the process group (accelerate's end_training: wait for every rank, then destroy)."""
    global _CURRENT
    if isinstance(_CURRENT, AccelerateDist):
        with contextlib.suppress(Exception):
            _CURRENT.barrier()
        _CURRENT.close()
    _CURRENT = None


# ---------------------------------------------------------------------- what crosses ranks


def gather_rows(dist: Dist, t: torch.Tensor) -> tuple[torch.Tensor, slice]:
    """Every rank's rows of `t` ([n_r] or [n_r, T_r], right-padded with zeros to the widest), in rank
    order, and the rows that are this rank's."""
    if dist.world == 1:
        return t, slice(0, t.shape[0])
    parts = dist.all_gather_object(t.detach().cpu())
    if t.dim() == 2:
        width = max(p.shape[1] for p in parts)
        parts = [torch.nn.functional.pad(p, (0, width - p.shape[1])) for p in parts]
    start = sum(p.shape[0] for p in parts[:dist.rank])
    return torch.cat(parts).to(t.device), slice(start, start + t.shape[0])


def gather_batch(dist: Dist, batch):
    """The step's whole batch, every rank's rows in rank order (for metrics and samples)."""
    if dist.world == 1:
        return batch
    return Rollouts.concat(dist.all_gather_object(batch))


def global_advantages(dist: Dist, estimator, x):
    """The estimator on the whole batch's rewards (group means and stds, batch scaling and REINFORCE++
    whitening over every rank's rows, as one process computes them); this rank's rows of the result."""
    from dataclasses import replace

    if dist.world == 1:
        return estimator(x)
    rewards, rows = gather_rows(dist, x.rewards)
    groups = dist.all_gather_object(int(x.group.max()) + 1 if x.group.numel() else 0)
    group, _ = gather_rows(dist, x.group + sum(groups[:dist.rank]))
    mask = gather_rows(dist, x.mask)[0] if x.mask is not None else None
    kl = gather_rows(dist, x.kl)[0] if x.kl is not None else None
    out = estimator(replace(x, rewards=rewards, group=group, mask=mask, kl=kl))
    adv = out.advantages[rows]
    if adv.dim() == 2:
        adv = adv[:, :x.mask.shape[1]]
    return replace(out, advantages=adv)


def gather_update(dist: Dist, result, batch):
    """An UpdateResult over the whole batch (rows and tensors in `gather_batch` order); stats are
    token-weighted over every rank's trained rows, the loss summed (each rank's is its share)."""
    from dataclasses import replace

    if dist.world == 1:
        return result
    tokens = float(batch.loss_mask[result.rows].sum()) if result.rows.numel() else 0.0
    parts = dist.all_gather_object((result.stats, tokens, result.rows.cpu(), result.num_rows))
    total = sum(p[1] for p in parts)
    stats: dict[str, float] = {}
    for s, w, _, _ in parts:
        for k, v in s.items():
            stats[k] = stats.get(k, 0.0) + (v if k == "loss" else v * w / total if total else 0.0)
    rows, offset = [], 0
    for _, _, r, n in parts:
        rows.append(r + offset)
        offset += n
    return replace(result, stats=stats, logprobs=gather_rows(dist, result.logprobs)[0],
                   entropy=gather_rows(dist, result.entropy)[0], rows=torch.cat(rows), num_rows=offset)


def weighted_means(dist: Dist, values: dict[str, tuple[float, float]]) -> dict[str, float]:
    """{key: (mean, weight)} per rank -> {key: the weight-averaged mean over ranks}; a key absent (or of
    weight 0) on every rank is absent."""
    parts = dist.all_gather_object(values)
    out: dict[str, float] = {}
    for key in dict.fromkeys(k for p in parts for k in p):
        w = sum(p[key][1] for p in parts if key in p)
        if w:
            out[key] = sum(p[key][0] * p[key][1] for p in parts if key in p) / w
    return out


def sum_counts(dist: Dist, counts: dict[str, int]) -> dict[str, int]:
    """Per-key sums over ranks (a key missing on a rank counts 0); keys in first-seen order."""
    if dist.world == 1:
        return counts
    out: dict[str, int] = {}
    for part in dist.all_gather_object(counts):
        for k, v in part.items():
            out[k] = out.get(k, 0) + v
    return out


# ---------------------------------------------------------------------- the run folder: rank 0's


class _NullWriter:
    def write(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


def replica_run_dir(path):
    """The run folder as a rank other than 0 sees it: it reads (config, checkpoints) but never writes,
    never locks; rank 0 holds the lock and writes metrics, samples, checkpoints."""
    class ReplicaRunDir(RunDir):
        def lock(self) -> None:
            pass

        def discard(self) -> None:
            pass

        def writer(self, name: str):
            return _NullWriter()

        def metrics(self) -> list[dict]:
            return []

        def recover(self) -> list[str]:
            return []

        def save_checkpoint(self, step: int, write_fn, keep_last: int):
            return self.ckpt_dir / f"{CKPT_PREFIX}{step:06d}"

    return ReplicaRunDir(path)
