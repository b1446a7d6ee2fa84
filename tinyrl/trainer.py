"""The GRPO trainer: one loop, its phases in order (see ARCHITECTURE.md).

    1. engine.generate(prompts, n=G)        -> Rollouts (ids, masks, sampling logprobs)
    2. rewards(Rollouts)                    -> per-component and total rewards
    3. advantages(Rollouts, estimator)      -> advantages (+ dynamic-sampling filter)
    4. engine.release()                     (vLLM: free the KV cache; weights stay)
    5. num_iterations x micro-batches: fused linear loss, backward
    6. optimizer step (skipped when the loss or gradient is not finite)
    7. engine.sync(model)                   (LoRA adapter only)
    8. monitor.update(...) and log
"""

from __future__ import annotations

import logging
import math
import re
import signal
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tinyrl import checkpoint
from tinyrl.algo import shaping
from tinyrl.algo.advantages import ESTIMATORS, AdvantageInputs
from tinyrl.algo.losses import LossSettings, kl_penalty
from tinyrl.config import RunConfig
from tinyrl.data import PromptSource, load_rows, render_prompt
from tinyrl.evaluate import accuracy
from tinyrl.model import load_policy
from tinyrl.monitor import Monitor, apply_action
from tinyrl.rewards.core import RewardSet, score_rollouts
from tinyrl.rollout import make_engine
from tinyrl.rollout.base import Rollouts, SamplingParams
from tinyrl.runs import RunDir
from tinyrl.update import policy_update, score_logprobs

log = logging.getLogger("tinyrl")


class StaleWeightsError(RuntimeError):
    """The rollout engine is not sampling from the trained weights (the monitor's canary)."""


@dataclass
class Run:
    path: Path
    metrics: list[dict]
    eval_before: float | None = None
    eval_after: float | None = None
    adapter: Path | None = None
    alarms: list[dict] = field(default_factory=list)
    interrupted: bool = False


class Trainer:
    def __init__(self, cfg: RunConfig, run: RunDir):
        self.cfg = cfg
        self.run = run
        torch.manual_seed(cfg.train.seed)
        self.model, self.tokenizer = load_policy(cfg.model, cfg.lora)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if not getattr(self.model, "is_loaded_in_4bit", False):
            self.model.to(self.device)
        self.engine = make_engine(cfg.rollout.engine, self.model, self.tokenizer, cfg, seed=cfg.train.seed)

        train_rows, self.eval_rows, self.task = load_rows(cfg.data)
        for r in train_rows + self.eval_rows:
            r["rendered"] = render_prompt(self.tokenizer, r["prompt"], cfg.data)
        self.prompts = PromptSource(train_rows, cfg.data.seed)
        self.rewards = RewardSet(cfg.reward.functions, self.task, cfg.reward.combine)
        stop = list(cfg.rollout.stop) or (self.task.stop if self.task else [])
        self.sampling = SamplingParams(cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_new_tokens, stop)
        self.loss_settings = LossSettings.from_config(cfg.algo)

        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
        self.scheduler = checkpoint.make_scheduler(self.optimizer, cfg.train, cfg.algo.num_iterations)
        self.monitor = Monitor(cfg.monitor)
        self.step = 0
        self.skipped_steps = 0
        self.no_signal_steps = 0
        self.eval_before: float | None = None
        self._stop_signal = False
        if cfg.algo.llds_lambda > 0 and cfg.algo.num_iterations < 2:
            log.warning("algo.llds_lambda > 0 acts only when the policy moves within a rollout batch: "
                        "set algo.num_iterations >= 2, otherwise LLDS adds nothing")

    # ------------------------------------------------------------------ the loop

    def train(self) -> Run:
        cfg = self.cfg
        if self.step == 0 and cfg.train.eval_before_after and self.task and self.eval_rows:
            self.eval_before = self.evaluate()
            log.info("held-out accuracy before training: %.3f", self.eval_before)
        metrics_out = self.run.writer("metrics.jsonl")
        samples_out = self.run.writer("samples.jsonl")
        alarms_out = self.run.writer("alarms.jsonl")
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        bar = _progress(cfg, self.step)
        interrupted = False
        try:
            while self.step < cfg.train.steps:
                metrics, samples = self.train_step()
                metrics_out.write(metrics)
                for s in samples:
                    samples_out.write(s)
                for alarm in self.monitor.update(self.step, metrics):
                    log.warning("%s %s at step %d: %s. Suggested: %s", alarm.severity.upper(), alarm.name, alarm.step, alarm.evidence, alarm.action)
                    if not alarm.fatal:
                        apply_action(self, alarm)  # optional automatic fixes (off by default)
                    alarms_out.write(alarm.__dict__)  # with what the auto-action did, if one ran
                    if alarm.fatal:
                        raise StaleWeightsError(f"{alarm.name} at step {alarm.step}: {alarm.evidence}. {alarm.action}")
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(reward=f"{metrics['reward_mean']:.3f}", loss=f"{metrics['loss']:.3g}")
                if cfg.train.save_every and self.step % cfg.train.save_every == 0 and self.step < cfg.train.steps:
                    self.save_checkpoint()
                if self._stop_signal:
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            interrupted = True
            self.save_checkpoint()
            log.warning("interrupted at step %d: checkpoint saved; continue with `tinyrl train --resume %s`",
                        self.step, self.run.path)
        finally:
            signal.signal(signal.SIGTERM, previous)
            for w in (metrics_out, samples_out, alarms_out):
                w.close()
            if bar is not None:
                bar.close()
        if interrupted:
            return Run(self.run.path, self.run.metrics(), self.eval_before, interrupted=True,
                       alarms=self.monitor.fired)
        self.save_checkpoint()
        adapter = self.run.path / "adapter"
        self.model.save_pretrained(adapter)
        after = self.evaluate() if cfg.train.eval_before_after and self.task and self.eval_rows else None
        return Run(self.run.path, self.run.metrics(), self.eval_before, after, adapter, self.monitor.fired)

    def train_step(self) -> tuple[dict, list[dict]]:
        cfg, t0 = self.cfg, time.perf_counter()
        batch, roll_stats = self.rollout()  # 1-3: generate, reward, advantages (+ dynamic sampling)
        t_gen = time.perf_counter() - t0
        self.engine.release()  # 4
        if cfg.algo.beta > 0:
            batch.ref_logprobs = score_logprobs(self.model, batch, cfg.rollout.temperature, cfg.train.micro_batch_size,
                                                cfg.algo.chunk_size, cfg.algo.loss_impl, reference=True)
        first = last = None
        for it in range(cfg.algo.num_iterations):  # 5-6
            last = policy_update(
                self.model, self.optimizer, batch, self.loss_settings, temperature=cfg.rollout.temperature,
                micro_batch=cfg.train.micro_batch_size, max_grad_norm=cfg.train.max_grad_norm,
                chunk_size=cfg.algo.chunk_size, impl=cfg.algo.loss_impl, use_tis=cfg.algo.tis != "none")
            with warnings.catch_warnings():  # a step taken without an optimiser step still advances the schedule
                warnings.filterwarnings("ignore", re.escape("Detected call of `lr_scheduler.step()`"), UserWarning)
                self.scheduler.step()
            if it == 0:
                first = last
                batch.old_logprobs = last.logprobs  # fixed for the later passes over this batch
            self.skipped_steps += last.skipped
            self.no_signal_steps += last.no_signal
        moved = self._update_effect(batch, first) if cfg.log.track_likelihood else {}
        self.engine.sync(self.model)  # 7
        self.step += 1
        dt = time.perf_counter() - t0
        metrics = self._metrics(batch, first, last, {**roll_stats, **moved}, dt, t_gen)
        return metrics, self._samples(batch)

    # ------------------------------------------------------------------ phases

    def rollout(self) -> tuple[Rollouts, dict]:
        """Generate B groups, score them, compute advantages; with dynamic sampling, keep only
        groups whose rewards differ and sample again until B groups or the round cap."""
        cfg = self.cfg
        B, G = cfg.train.prompts_per_step, cfg.rollout.num_generations
        kept: list[Rollouts] = []
        n_kept = dropped = rounds = 0
        failures: dict[str, int] = {}
        while n_kept < B:
            rows = self.prompts.next_batch(B - n_kept if kept else B)
            batch = self.engine.generate([r["rendered"] for r in rows], n=G, params=self.sampling, columns=rows)
            batch, report = score_rollouts(batch, self.rewards)
            last_full = batch
            for k, v in report.failures.items():
                failures[k] = failures.get(k, 0) + v
            if cfg.algo.overlong_buffer > 0:
                pen = shaping.overlong_penalty(batch.completion_lengths, self.sampling.max_new_tokens,
                                               cfg.algo.overlong_buffer, cfg.algo.overlong_penalty)
                batch.reward_components["overlong"] = pen
                batch.rewards = batch.rewards + pen
            if cfg.algo.dynamic_sampling:
                informative = shaping.informative_groups(batch.rewards, batch.group)
                dropped += int((~informative).sum())
                if not informative.all():
                    batch = batch.select(torch.nonzero(informative[batch.group]).squeeze(-1))
            kept.append(batch)
            n_kept += int(batch.group.max()) + 1 if batch.num_rows else 0
            rounds += 1
            if not cfg.algo.dynamic_sampling or rounds > cfg.algo.max_sampling_rounds:
                break
        kept = [b for b in kept if b.num_rows]
        # No informative group at all within the cap: train on the last batch (all advantages 0).
        batch = Rollouts.concat(kept) if kept else last_full
        if cfg.algo.mask_truncated:
            batch.loss_mask = batch.loss_mask * (~batch.truncated)[:, None]
        adv_stats = self.advantages(batch)
        return batch, {"dynamic_dropped_groups": dropped, "sampling_rounds": rounds,
                       "reward_failures": sum(failures.values()), **adv_stats,
                       **{f"reward_failures/{k}": v for k, v in failures.items()}}

    def advantages(self, batch: Rollouts) -> dict:
        cfg = self.cfg.algo
        kl = None
        if cfg.estimator == "reinforce_pp" and cfg.beta > 0:  # k1 KL folded into token rewards
            ref = score_logprobs(self.model, batch, self.cfg.rollout.temperature, self.cfg.train.micro_batch_size,
                                 cfg.chunk_size, cfg.loss_impl, reference=True)
            kl = kl_penalty(batch.sampling_logprobs, ref, "k1") * batch.completion_mask
        out = ESTIMATORS[cfg.estimator](AdvantageInputs(
            batch.rewards, batch.group, cfg.scale, cfg.std_eps, batch.completion_mask, kl, cfg.beta))
        batch.advantages = out.advantages
        return {"zero_std_frac": out.zero_std_frac, "reward_group_std": out.group_std_mean}

    def evaluate(self) -> float:
        return accuracy(self.engine, self.eval_rows, self.task, self.sampling)

    def _update_effect(self, batch: Rollouts, first) -> dict:
        """Re-score the batch after the update: how far did the policy move (KL old->new, and the
        tokens whose ratio left the clip range), and did the positive-advantage responses'
        likelihood rise, as the update meant it to (lazy likelihood displacement when not)?"""
        if first.no_signal:  # no optimiser step was taken: the weights did not move
            return {"update_kl": 0.0, "update_clip_frac": 0.0}
        m = batch.completion_mask.float()
        new = score_logprobs(self.model, batch, self.cfg.rollout.temperature, self.cfg.train.micro_batch_size,
                             self.cfg.algo.chunk_size, self.cfg.algo.loss_impl)
        old = first.logprobs
        log_r = (new - old) * m
        n = m.sum().clamp(min=1)
        adv = batch.advantages if batch.advantages.dim() == 1 else (batch.advantages * m).sum(-1) / m.sum(-1).clamp(min=1)
        ratio, a = torch.exp(log_r), adv[:, None]
        s = self.loss_settings
        out_of_range = ((ratio > 1 + s.epsilon_high) & (a > 0)) | ((ratio < 1 - s.epsilon_low) & (a < 0))
        out = {"update_kl": float(((torch.exp(-log_r) + log_r - 1) * m).sum() / n),  # k3 of KL(old || new)
               "update_clip_frac": float((out_of_range * m).sum() / n)}
        pos = adv > 0
        if pos.any():
            mp = m[pos]
            delta = log_r[pos].sum(-1)  # per response, change of its total log-likelihood
            out.update({"logp_pos_mean": float((old[pos] * mp).sum() / mp.sum().clamp(min=1)),
                        "logp_pos_delta": float(delta.sum() / mp.sum().clamp(min=1)),  # per token
                        "frac_pos_delta_nonpos": float((delta <= 0).float().mean())})
        return out

    # ------------------------------------------------------------------ logging

    def _metrics(self, batch: Rollouts, res, last, roll_stats: dict, dt: float, t_gen: float) -> dict:
        """`res` is the first pass over the batch (entropy and logprobs of the sampling policy),
        `last` the last (its loss stats: clip fractions are 0 by construction with one pass)."""
        m = batch.completion_mask.float()
        n_tok = float(m.sum())
        valid = ~torch.isnan(batch.rewards)
        ent = res.entropy[m.bool()]
        d = (batch.sampling_logprobs - res.logprobs) * m  # rollout - trainer, sampled tokens
        out = {
            "step": self.step,
            "reward_mean": float(batch.rewards[valid].mean()) if valid.any() else float("nan"),
            "reward_std": float(batch.rewards[valid].std()) if valid.sum() > 1 else 0.0,
            **{f"reward/{k}": float(torch.nanmean(v)) for k, v in batch.reward_components.items()},
            "loss": last.stats.get("loss", float("nan")),
            **{k: v for k, v in last.stats.items() if k != "loss"},
            "entropy": res.stats.get("entropy", float("nan")),
            "entropy_p10": float(torch.quantile(ent, 0.1)) if ent.numel() else 0.0,
            "entropy_p90": float(torch.quantile(ent, 0.9)) if ent.numel() else 0.0,
            "grad_norm": res.grad_norm,
            "skipped_nonfinite": bool(res.skipped),
            "skipped_steps_total": self.skipped_steps,
            "skipped_no_signal": bool(last.no_signal),
            "completion_len": float(batch.completion_lengths.float().mean()),
            "truncated_frac": float(batch.truncated.float().mean()),
            "rollout_trainer_k3": float(((torch.exp(d) - d - 1) * m).sum() / max(n_tok, 1)),
            "rollout_trainer_maxdiff": float(d.abs().max()) if n_tok else 0.0,
            "lr": self.optimizer.param_groups[0]["lr"],
            "step_time": dt,
            "gen_time": t_gen,
            "tokens_per_s": n_tok / dt if dt > 0 else 0.0,
            **roll_stats,
        }
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}

    def _samples(self, batch: Rollouts) -> list[dict]:
        k = min(self.cfg.log.samples_per_step, batch.num_rows)
        return [{"step": self.step, "prompt": batch.prompts[i], "completion": batch.completions[i],
                 "reward": None if math.isnan(float(batch.rewards[i])) else float(batch.rewards[i]),
                 **{f"reward/{n}": float(v[i]) for n, v in batch.reward_components.items()}} for i in range(k)]

    # ------------------------------------------------------------------ checkpoints

    def _on_sigterm(self, signum, frame):
        self._stop_signal = True

    def save_checkpoint(self) -> Path:
        return checkpoint.save(self)

    def load_checkpoint(self, path: Path) -> None:
        checkpoint.load(self, path)


def _progress(cfg: RunConfig, start: int):
    if not cfg.log.progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=cfg.train.steps, initial=start, desc="grpo", unit="step", dynamic_ncols=True)
