"""The GRPO trainer: one loop, its phases in order (see ARCHITECTURE.md).

    per step (`train_step`):
    1-3. collect       the run's batch source (tinyrl.sources: synchronous, partial rollouts, one-step-off)
                       does phases 1-3 with the run's current config and hands over a batch of whole groups:
    1. generate        engine.generate(prompts, n=G) -> Rollouts (ids, masks, sampling logprobs)
    2. reward          the run's reward functions -> per-component and total rewards
    3. shape           DAPO overlong penalty; dynamic sampling keeps informative groups, samples again
    4. release         engine.release() (vLLM: free the KV cache; weights stay)
    5. reference       adapter-off logprobs, once, when beta > 0 (before the advantages: REINFORCE++
                       folds the KL into its token rewards)
    6. advantages      the estimator (grpo, rloo, ...) on the rewards
    7. select tokens   mask_truncated; top-entropy token selection over the whole batch
    8. update          num_iterations x (micro-batched fused loss, backward, optimizer step)
    9. measure         re-score the batch: how far the update moved the policy (update_kl, LLD)
    10. sync           engine.sync(model) (the LoRA adapter only)
    then, in the loop (`train`): monitor -> log -> checkpoint.

The trainer does not know whether a batch is single- or multi-turn: an agent engine returns the
same `Rollouts`, with tool observations marked in `observation_mask`.
"""

from __future__ import annotations

import logging
import re
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from peft import set_peft_model_state_dict
from tqdm.auto import tqdm

from tinyrl import checkpoint, distributed, hub_sync, kernels
from tinyrl.algo.advantages import ESTIMATORS, AdvantageInputs
from tinyrl.algo.losses import kl_penalty, top_entropy_mask
from tinyrl.algo.movement import update_movement
from tinyrl.checkpoint import CheckpointData
from tinyrl.config import RunConfig, with_fields
from tinyrl.data import PromptSource
from tinyrl.distributed import Dist
from tinyrl.errors import ResumeError, StaleWeightsError
from tinyrl.evaluation import accuracy, run_sampled
from tinyrl.metrics import samples_of, step_metrics
from tinyrl.monitor import Action, Monitor, planned_action
from tinyrl.rewards.core import RewardSet
from tinyrl.rollout.base import Rollouts, SamplingParams
from tinyrl.runs import Run, RunDir
from tinyrl.sources import Shaper, StepInput, make_source
from tinyrl.stop import StopSignals
from tinyrl.trackers.fanout import open_trackers
from tinyrl.update import UpdateResult, initial_loss_scale, next_loss_scale, policy_update, score

log = logging.getLogger("tinyrl")


@dataclass
class TrainerState:
    """What changes as a run trains, besides the weights, the optimizer and the schedule: what a
    checkpoint saves and restores, what the step metrics report, what the monitor's actions change.
    Its one owner is the trainer; the batch sources, the shaper and the loss get the config it implies
    (`Trainer.cfg`) with each call and return what they changed (tinyrl.sources.Collected)."""

    step: int = 0
    skipped_steps: int = 0  # optimiser steps skipped for a non-finite loss or gradient
    no_signal_steps: int = 0  # optimiser steps skipped for want of any learning signal
    eval_before: float | None = None  # held-out accuracy before training (None: not measured)
    eval_before_from: str | None = None  # the stage whose "after" is this run's "before" (a stage chain carried it)
    eval_sampled: dict = field(default_factory=dict)  # "before" / "after" -> pass@k, maj@k (train.eval_samples)
    micro_batch: int = 0  # completions per forward/backward; halved on an out-of-memory error
    rollout_prompts: int | None = None  # prompts per engine call; set on an out-of-memory error
    oom_retries: int = 0
    loss_scale: float = 1.0  # fp16 training: the dynamic loss scale (halved on an overflow, doubled when stable)
    scaled_steps: int = 0  # optimiser steps since the loss scale last changed
    # dotted config field -> value, set by the monitor's automatic actions: applied over the run's
    # config on every resume, never written to config.yaml (they are the run's, not the user's)
    config_patches: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainerParts:
    """What a trainer trains with, built by its method (tinyrl.methods.grpo.build)."""

    model: Any  # the peft model, on this process's device
    tokenizer: Any
    engine: Any  # a tinyrl.rollout engine
    task: Any  # the tinyrl.tasks.Task, or None (a jsonl run)
    train_rows: list[dict]  # each with its `rendered` prompt
    eval_rows: list[dict]
    rewards: RewardSet
    sampling: SamplingParams


class Trainer:
    def __init__(self, cfg: RunConfig, run: RunDir, parts: TrainerParts, dist: Dist):
        self.base_cfg = cfg  # as resolved; `self.cfg` is it with the monitor's patches (in self.state)
        self.state = TrainerState(micro_batch=cfg.train.micro_batch_size, loss_scale=initial_loss_scale(cfg))
        self._patched: tuple[str, RunConfig] = ("[]", cfg)  # (the patches it was built from, the config)
        self.run = run
        self.dist = dist  # [dist] one process, or this rank of the launch
        self.device = dist.device  # [dist] cuda:<local rank> (or the CPU)
        self.model, self.tokenizer, self.engine, self.task = parts.model, parts.tokenizer, parts.engine, parts.task
        self.eval_rows, self.rewards, self.sampling = parts.eval_rows, parts.rewards, parts.sampling
        self.prompts = PromptSource(parts.train_rows, cfg.data.seed, dist.rank, dist.world)  # [dist]
        self.source = make_source(cfg, self.engine, self.prompts, Shaper(self.rewards, self.sampling), dist,
                                  self.model)  # synchronous, partial rollouts, one-step-off
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
        self.scheduler = checkpoint.make_scheduler(self.optimizer, cfg.train, cfg.algo.num_iterations)
        self.monitor = Monitor(cfg.monitor)
        self._in_step = False
        log.info("algo: %s", {k: v for k, v in vars(cfg.algo).items() if v is not None})
        if cfg.algo.llds_lambda > 0 and cfg.algo.num_iterations < 2:
            log.warning("algo.llds_lambda > 0 acts only when the policy moves within a rollout batch: "
                        "set algo.num_iterations >= 2, otherwise LLDS adds nothing")

    @property
    def cfg(self) -> RunConfig:
        """The run's config now: as resolved, with the monitor's patches (kept in `state`) applied. Derived,
        never stored elsewhere: after an action or a resume every phase reads the same config."""
        key = repr(sorted(self.state.config_patches.items()))
        if self._patched[0] != key:
            self._patched = (key, with_fields(self.base_cfg, self.state.config_patches))
        return self._patched[1]

    # ------------------------------------------------------------------ the loop

    def train(self) -> Run:
        cfg = self.cfg
        st = self.state
        outs = {name: self.run.writer(f"{name}.jsonl") for name in ("metrics", "samples", "alarms")}
        outs["trackers"] = trackers = open_trackers(cfg, self.run.path, self.dist.is_main, st.step)  # log.report_to
        stop = StopSignals(defer=lambda: self._in_step,  # inside a step, finish it first (within a deadline)
                           deadline_s=cfg.train.stop_timeout_s).__enter__()
        bar = None
        try:
            if st.step == 0 and st.eval_before is None and self._can_evaluate():
                log.info("held-out evaluation before training (%d prompts)", len(self.eval_rows))
                st.eval_before = self.evaluate("before")
                log.info("held-out accuracy before training: %.3f", st.eval_before)
                trackers.held_out(st.eval_before, 0)
                trackers.held_out_sampled(st.eval_sampled.get("before"), 0)  # pass@k, maj@k (train.eval_samples)
            bar = _progress(cfg, st.step) if self.dist.is_main else None  # [dist]
            while st.step < self.cfg.train.steps and not self.dist.any(stop.requested):  # [dist] all stop together
                self._in_step = True  # until its row is logged: a stop request waits for the whole step
                metrics, samples = self.train_step()
                alarms = self.watch(metrics)
                self.log(outs, metrics, samples, alarms, bar)
                self._in_step = False
                every, steps = self.cfg.train.save_every, self.cfg.train.steps
                if every and st.step % every == 0 and st.step < steps:
                    self.save_checkpoint()
            if stop.requested:
                raise KeyboardInterrupt
            self.save_checkpoint()
            adapter = self.run.path / "adapter"
            if self.dist.is_main:  # [dist] rank 0 owns the run folder
                self.model.save_pretrained(adapter)
            after = None
            if self._can_evaluate():
                log.info("held-out evaluation after training (%d prompts)", len(self.eval_rows))
                after = self.evaluate("after")
                trackers.held_out(after, st.step)
                trackers.held_out_sampled(st.eval_sampled.get("after"), st.step)
        except KeyboardInterrupt:
            if not self._in_step:  # between steps (or in an evaluation): the state is whole, keep it
                self.save_checkpoint()
                log.warning("interrupted at step %d: checkpoint saved; continue with `tinyrl train --resume %s`",
                            st.step, self.run.path)
            else:  # a second Ctrl-C inside a step: the step's state is half-applied, nothing of it is saved
                last = self.run.latest_checkpoint()
                log.warning("aborted inside step %d: %s", st.step + 1, f"continue from {last.name} with `tinyrl "
                            f"train --resume {self.run.path}`" if last else "no checkpoint was saved before it, "
                            "so nothing can be resumed; start the run again")
            return Run(self.run.path, self.run.metrics(), st.eval_before, interrupted=True, alarms=self.monitor.fired,
                       resumable=self.run.latest_checkpoint() is not None)
        finally:
            stop.__exit__()
            for w in outs.values():
                w.close()
            if bar is not None:
                bar.close()
        return Run(self.run.path, self.run.metrics(), st.eval_before, after, adapter, self.monitor.fired)

    def train_step(self) -> tuple[dict, list[dict]]:
        cfg, t0 = self.cfg, time.perf_counter()
        batch, gen_stats = self.collect_batch()  # 1-3: generate, reward, shape (+ dynamic sampling rounds)
        t_gen = time.perf_counter() - t0
        self.engine.release()  # 4
        self.reference(batch)  # 5
        adv_stats = self.advantages(batch)  # 6
        self.select_tokens(batch)  # 7
        first, last = self.update(batch)  # 8
        moved = self.measure_update(batch, first) if cfg.log.track_likelihood else {}  # 9
        self.engine.sync(self.model)  # 10
        self.state.step += 1
        # [dist] metrics and samples over every rank's rows (the same on every rank: the monitor agrees)
        whole, d = distributed.gather_batch(self.dist, batch), self.dist
        metrics = step_metrics(self.state, self.optimizer.param_groups[0]["lr"], whole,
                               distributed.gather_update(d, first, batch), distributed.gather_update(d, last, batch),
                               {**gen_stats, **adv_stats, **moved, "processes": d.world}, time.perf_counter() - t0, t_gen)
        return metrics, samples_of(whole, self.state.step, cfg.log.samples_per_step)

    # ------------------------------------------------------------------ phases

    def collect_batch(self) -> tuple[Rollouts, dict]:
        """Phases 1-3 (generate, reward, shape): the source's batch for this step (tinyrl.sources), collected
        with the run's current config; the state keeps what the collection changed (the rollout's OOM cap)."""
        st = self.state
        got = self.source.collect(StepInput(self.cfg, st.step, st.rollout_prompts))
        st.rollout_prompts, st.oom_retries = got.rollout_prompts, st.oom_retries + got.oom_retries
        return got.batch, got.stats

    def reference(self, batch: Rollouts) -> None:
        """The reference policy's logprobs (adapter disabled), once per step, when beta > 0."""
        if self.cfg.algo.beta > 0:
            batch.ref_logprobs = self._score(batch, reference=True).logprobs

    def advantages(self, batch: Rollouts) -> dict:
        a = self.cfg.algo
        kl = None
        if a.kl_in_reward and a.beta > 0:  # REINFORCE++: the KL is charged in the token rewards, not the loss
            kl = kl_penalty(batch.sampling_logprobs, batch.ref_logprobs, a.kl_estimator) * batch.action_mask
        out = distributed.global_advantages(self.dist, self._estimator(),  # [dist] statistics of the whole batch
                                            AdvantageInputs(batch.rewards, batch.group, a.scale, a.std_eps,
                                                            batch.action_mask, kl, a.beta))
        batch.advantages = out.advantages
        return {"zero_std_frac": out.zero_std_frac, "reward_group_std": out.group_std_mean}

    def select_tokens(self, batch: Rollouts) -> None:
        """The loss mask: without truncated completions (mask_truncated), and only the top-q tokens by
        entropy over the whole batch (top_entropy_quantile; entropies of the policy before the update).
        The loss divides by the tokens kept (token_mean), so the update's scale does not shrink by q."""
        a = self.cfg.algo
        if a.mask_truncated:
            batch.loss_mask = batch.loss_mask * (~batch.truncated)[:, None]
        if a.top_entropy_quantile is not None:
            ent, mine = distributed.gather_rows(self.dist, self._score(batch).entropy)  # [dist] the whole batch's
            mask, _ = distributed.gather_rows(self.dist, batch.loss_mask)  # quantile, this rank's rows of it
            keep = top_entropy_mask(ent, mask, a.top_entropy_quantile)[mine, :batch.loss_mask.shape[1]]
            batch.loss_mask = keep.to(batch.loss_mask.dtype)

    def update(self, batch: Rollouts) -> tuple[UpdateResult, UpdateResult]:
        """num_iterations optimiser steps over the batch; returns the first pass (the sampling policy's
        logprobs and entropies) and the last (its loss stats)."""
        cfg = self.cfg
        first = last = None
        for it in range(cfg.algo.num_iterations):
            last = self._policy_update_oom_safe(batch, score_rest=it == 0)
            with warnings.catch_warnings():  # a step taken without an optimiser step still advances the schedule
                warnings.filterwarnings("ignore", re.escape("Detected call of `lr_scheduler.step()`"), UserWarning)
                self.scheduler.step()
            if it == 0:
                first = last
                batch.old_logprobs = last.logprobs  # fixed for the later passes over this batch
            self.state.skipped_steps += last.skipped and not last.overflow
            self.state.no_signal_steps += last.no_signal
            st = self.state
            st.loss_scale, st.scaled_steps = next_loss_scale(st.loss_scale, st.scaled_steps, last)
        return first, last

    def measure_update(self, batch: Rollouts, first: UpdateResult) -> dict:
        """Re-score the rows the update trained on: how far the policy moved, by the loss's own ratio rule
        (tinyrl.algo.movement: update_kl, update_clip_frac, lazy likelihood displacement). Nothing when no
        optimiser step was taken: nothing moved."""
        if first.no_signal or first.skipped:
            return {}
        rows = first.rows
        new = self._score(batch, rows=rows).logprobs[rows]
        moved = update_movement(first.logprobs[rows], new, batch.advantages[rows], batch.loss_mask[rows],
                                self.cfg.algo)
        return distributed.weighted_means(self.dist, moved)  # [dist] (mean, weight) per rank, weight-averaged

    def _policy_update_oom_safe(self, batch: Rollouts, score_rest: bool) -> UpdateResult:
        """policy_update; on an out-of-memory error, halve the micro-batch and redo the step from the same
        batch. Nothing was stepped yet (the optimiser steps after the last backward) and the loss is
        normalised by the whole batch's totals, so the gradient is the one a smaller micro-batch gives
        from the start (to fp32 rounding); groups are never split across optimiser steps. The smaller
        micro-batch stays for the rest of the run (`micro_batch_now` in metrics.jsonl)."""
        cfg, st = self.cfg, self.state
        while True:
            try:
                return policy_update(self.model, self.optimizer, batch, cfg.algo, temperature=cfg.rollout.temperature,
                                     micro_batch=st.micro_batch, max_grad_norm=cfg.train.max_grad_norm,
                                     max_len=cfg.rollout.max_new_tokens, score_rest=score_rest,
                                     dist=self.dist, loss_scale=st.loss_scale)  # [dist]
            except torch.OutOfMemoryError:
                self.optimizer.zero_grad(set_to_none=True)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                if st.micro_batch == 1:
                    raise
                st.micro_batch //= 2
                st.oom_retries += 1
                log.warning("out of memory in the update: micro-batch halved to %d; redoing the step from the "
                            "same batch", st.micro_batch)

    # ------------------------------------------------------------------ monitor, log, evaluation

    def watch(self, metrics: dict) -> list:
        """Run the monitor's rules; take its enabled automatic actions; a fatal alarm stops the run."""
        alarms = self.monitor.update(self.state.step, metrics)
        for alarm in alarms:
            log.warning("%s %s at step %d: %s. Suggested: %s", alarm.severity.upper(), alarm.name, alarm.step,
                        alarm.evidence, alarm.action)
            action = None if alarm.fatal else planned_action(self.monitor, alarm, self.cfg)  # off by default
            if action is not None:
                alarm.applied = self.take(action)
                log.warning("monitor auto-action for %s at step %d: %s", alarm.name, alarm.step, alarm.applied)
        return alarms

    def take(self, action: Action) -> str:
        """Carry out a monitor action: a config patch (kept in the state, so in every checkpoint) or a
        rollback; returns what was done, in words."""
        if action.rollback:
            return self.rollback()
        self.state.config_patches.update(action.patch)  # `self.cfg` follows: every phase reads it
        return action.message

    def rollback(self) -> str:
        """Reload the adapter weights and optimizer state of the last checkpoint. Step count, LR
        schedule, data order and RNG go on: replaying the same batches would repeat the explosion."""
        mon, ckpt = self.monitor, self.run.latest_checkpoint()
        if ckpt is None:
            return "no checkpoint to roll back to (set train.save_every); nothing changed"
        if mon.rollbacks >= mon.cfg.max_rollbacks:
            return f"rolled back {mon.rollbacks} times already (monitor.max_rollbacks); nothing changed"
        try:
            data = checkpoint.read(ckpt)
        except checkpoint.CorruptCheckpoint as e:
            return f"the last checkpoint does not load ({e}); nothing changed"
        set_peft_model_state_dict(self.model, data.weights)
        self.optimizer.load_state_dict(data.state["optimizer"])
        self.engine.sync(self.model)  # the engine must sample from the restored weights
        mon.rollbacks += 1
        return f"rolled back adapter weights and optimizer to {ckpt.name} (rollback {mon.rollbacks}/{mon.cfg.max_rollbacks})"

    def log(self, outs: dict, metrics: dict, samples: list[dict], alarms: list, bar) -> None:
        outs["metrics"].write(metrics)
        for s in samples:
            outs["samples"].write(s)
        for alarm in alarms:
            outs["alarms"].write(alarm.__dict__)  # with what the auto-action did, if one ran
        outs["trackers"].log_step(self.state.step, metrics, samples, alarms)  # sample tables every log.samples_every
        for alarm in alarms:
            if alarm.fatal:
                raise StaleWeightsError(f"{alarm.name} at step {alarm.step}: {alarm.evidence}. {alarm.action}")
        if bar is not None:
            bar.update(1)
            r = metrics["reward_mean"]
            bar.set_postfix(reward="n/a" if r is None else f"{r:.3f}", loss=f"{metrics['loss']:.3g}")

    def evaluate(self, when: str) -> float:
        rows = self.eval_rows[self.dist.share(len(self.eval_rows))]  # [dist] each rank scores its share
        acc = accuracy(self.engine, rows, self.task, self.sampling) if rows else 0.0
        self.state.eval_sampled.update(run_sampled(  # pass@k, maj@k `when` (before / after) with train.eval_samples
            self.engine, self.eval_rows, self.task, self.sampling, self.cfg.train, self.dist, when))
        return self.dist.all_reduce_sum(acc * len(rows)) / len(self.eval_rows)

    def _can_evaluate(self) -> bool:
        return bool(self.cfg.train.eval_before_after and self.task and self.eval_rows)

    # ------------------------------------------------------------------ helpers

    def _estimator(self):
        """The advantage estimator: its Triton kernel twin where the loss runs on Triton, else the torch one."""
        name = self.cfg.algo.estimator
        if kernels.resolve_impl(self.cfg.algo.loss_impl, self.device) == "triton" and name in kernels.KERNEL_ESTIMATORS:
            return lambda x: kernels.KERNEL_ESTIMATORS[name](x, self.device)
        return ESTIMATORS[name]

    def _score(self, batch: Rollouts, reference: bool = False, rows=None):
        """No-grad trainer logprobs and entropies of the batch's sampled tokens (see tinyrl.update.score)."""
        c = self.cfg
        return score(self.model, batch, c.rollout.temperature, c.train.micro_batch_size, c.algo.chunk_size,
                     c.algo.loss_impl, reference=reference, rows=rows)

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        """Everything a checkpoint holds besides the adapter (every rank's RNG state: a collective)."""
        rngs = self.dist.all_gather_object(checkpoint.rng_state())
        return {"trainer": asdict(self.state), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "rng": rngs[0], "rng_ranks": rngs,  # one per process
                "prompts": self.prompts.state_dict(), "engine": self.engine.state_dict(),
                "source": self.source.state_dict(),  # partial rollouts: the in-flight groups' prompts
                "monitor": self.monitor.state_dict(), "reward_failures": self.rewards.total_failures,
                "config": self.base_cfg.to_dict()}

    def save_checkpoint(self) -> Path:
        """Rank 0 writes the checkpoint (other ranks' run folder writes nothing)."""
        return hub_sync.on_save(self, checkpoint.write(self.run, self.state.step, self.model, self.state_dict(),
                                                       self.cfg.train.keep_last))  # log.push_to_hub (background)

    def load_checkpoint(self, path: Path) -> None:
        self.restore(checkpoint.read(path))

    def restore(self, data: CheckpointData) -> None:
        """Continue from a checkpoint that `checkpoint.read` accepted (ResumeError if the adapter does not fit)."""
        path, state = data.path, data.state
        expected = {k for k, p in self.model.named_parameters() if p.requires_grad}
        try:
            result = set_peft_model_state_dict(self.model, data.weights)
        except RuntimeError as e:
            raise ResumeError(f"the adapter in {path} does not fit model {self.cfg.model.name!r} "
                              f"(different base model or LoRA rank?): {e}") from e
        missing = [k for k in getattr(result, "missing_keys", []) if k in expected]
        if missing:
            raise ResumeError(f"the adapter in {path} lacks {len(missing)} LoRA tensors of this model "
                              f"(e.g. {missing[0]}): it was trained on another base or target_modules")
        # the monitor's actions come back with the state (its config_patches): `self.cfg` follows
        self.state = TrainerState(**{"micro_batch": self.base_cfg.train.micro_batch_size, **state["trainer"]})
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        ranks, d = state.get("rng_ranks") or [state["rng"]], self.dist
        if len(ranks) != d.world and d.is_main:
            log.warning("resume: checkpoint %s was written by %d process(es), this run has %d: the prompts and the "
                        "adapter continue exactly, the random streams of the processes do not", path.name,
                        len(ranks), d.world)
        checkpoint.set_rng_state(ranks[d.rank] if len(ranks) == d.world else state["rng"])
        self.prompts.load_state_dict(state["prompts"])
        self.source.load_state_dict(state.get("source", state.get("collector", {})))  # (older checkpoints)
        self.engine.load_state_dict(state["engine"])
        self.engine.sync(self.model)  # the engine samples from the restored adapter
        self.monitor.load_state_dict(state["monitor"])
        self.rewards.total_failures = dict(state["reward_failures"])


def _progress(cfg: RunConfig, start: int):
    return tqdm(total=cfg.train.steps, initial=start, desc="grpo", unit="step", dynamic_ncols=True) \
        if cfg.log.progress else None
