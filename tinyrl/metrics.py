"""One step's metrics row (metrics.jsonl) and its samples (samples.jsonl), from the step's batch.

A metric name means one quantity, and a quantity that was not measured is absent (or null),
never 0. Token statistics count the tokens the policy sampled (`Rollouts.action_mask`): tool
observations spliced into an agent's completion are not the policy's and never count.

    reward_excluded_frac       samples of the trained batch without a usable reward (a failed or
                               non-finite reward); 1.0: the step had nothing to learn from
    entropy, entropy_p10/p90   token entropy of the policy before the update, over the loss tokens
    entropy_adv_pos / _neg     the same over the samples better / worse than their group's mean
    rollout_trainer_k3         KL(behaviour || trainer) per token (k3) on those tokens: the engine's logprobs
    rollout_trainer_maxdiff    against the weights at the step's start. Synchronous: the stale-weights canary
                               (the engine must sample from the trained weights); with partial rollouts
                               (rollout.max_staleness > 0): how far off-policy the batch is
    rollout_trainer_k3_fresh   partial rollouts: the same KL over the tokens the current adapter sampled (the
                               stale-weights canary's input when a batch mixes policy versions)
    offpolicy_ess              normalised effective sample size (sum w)^2 / (n sum w^2) in (0, 1] of the
                               token weights w = pi_old / pi_behav on those tokens, in every algo.off_policy mode
    offpolicy_capped_frac      share of those tokens with w above the mode's cap (tinyrl.algo.losses.OFF_POLICY:
                               off_policy_cap; tis_cap for tis with `tis` on)
    update_rows_skipped_frac   rows the update did not train on (zero advantage, no other term)
    train_groups               groups (prompts) in the trained batch
    staleness_mean / _max      partial rollouts only (the collector's, through `extra`): policy versions between
    staleness/<lag>            a loss token's sampling and the update (mean, max; the share of loss tokens at
    stale_dropped_groups       each lag), groups dropped as too stale, groups still decoding carried into the
    carried_groups, overlap_s  next step, seconds of generation overlapping the update (one-step-off)
    update_kl                  KL(pi_old || pi_new) per token, re-scored after the update (Trainer.measure_update)
    ref_kl / pass_kl           KL(pi || reference) / KL(pi_old || pi) inside the loss (tinyrl.algo.losses)
    sandbox/<outcome>          code rewards only: completions per sandbox outcome (pass, fail, timeout, crash,
    sandbox/exit_call          output_limit, no_code, error), those calling sys.exit & co., and the seconds
    sandbox_time               spent in the sandbox; every sampling round and rank summed (tinyrl.rewards.code,
                               through RewardReport.tallies and the trainer's collect_batch)
"""

from __future__ import annotations

import math

import torch

from tinyrl.algo.losses import kl_penalty, offpolicy_stats


def _clean(row: dict) -> dict:
    """NaN and inf become null: strict JSON readers reject them, and they mean "not measured"."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def step_metrics(state, lr: float, batch, first, last, extra: dict, dt: float, t_gen: float) -> dict:
    """`state` is the trainer's `TrainerState` after the step; `first` is the first pass over the batch
    (the sampling policy's logprobs and entropies), `last` the last (its loss stats: clip fractions are
    0 by construction with one pass)."""
    rewards = batch.rewards.double()  # float64: the mean and std of huge finite rewards (1e38) stay finite
    valid = ~torch.isnan(rewards)
    action = batch.action_mask.float()
    n_act = float(action.sum())
    out = {
        "step": state.step,
        "reward_mean": float(rewards[valid].mean()) if valid.any() else None,
        "reward_std": float(rewards[valid].std()) if valid.sum() > 1 else None,
        "reward_excluded_frac": float((~valid).double().mean()) if len(rewards) else None,  # 1.0: nothing learned
        **{f"reward/{k}": float(torch.nanmean(v.double())) for k, v in batch.reward_components.items()},
        "loss": last.stats.get("loss", float("nan")),
        **{k: v for k, v in last.stats.items() if k not in ("loss", "entropy")},
        "grad_norm": first.grad_norm,
        "skipped_nonfinite": bool((first.skipped and not first.overflow) or (last.skipped and not last.overflow)),
        "skipped_steps_total": state.skipped_steps,
        "skipped_no_signal": bool(last.no_signal),
        "update_rows_skipped_frac": 1.0 - first.rows.numel() / max(first.num_rows, 1),
        "completion_len": n_act / max(batch.num_rows, 1),
        "truncated_frac": float(batch.truncated.float().mean()),
        "train_groups": int(torch.unique(batch.group).numel()),
        "lr": lr,
        "micro_batch_now": state.micro_batch,
        "oom_retries_total": state.oom_retries,
        **({"loss_scale": state.loss_scale, "loss_scale_overflow": bool(first.overflow or last.overflow)}
           if state.loss_scale != 1 else {}),  # fp16 training only
        "step_time": dt,
        "gen_time": t_gen,
        "tokens_per_s": n_act / dt if dt > 0 else 0.0,
        **_policy_token_stats(batch, first, state.step - 1),  # (the update trained at version step - 1)
        **_agent_stats(batch),
        **extra,
    }
    return _clean(out)


def _policy_token_stats(batch, first, version: int) -> dict:
    """Entropy, the behaviour-vs-trainer KL and the behaviour weights' statistics over the loss tokens (the
    first pass scores them all: its logprobs are the weights at the step's start). Tool observations are
    outside `action_mask`: their behaviour logprob (0) enters no statistic."""
    m = (batch.loss_mask * batch.action_mask).bool()
    if not m.any():
        return {}
    ent = first.entropy[m]
    d = kl_penalty(batch.sampling_logprobs[m], first.logprobs[m])
    diff = (batch.sampling_logprobs[m] - first.logprobs[m]).abs()
    weights = offpolicy_stats(first.logprobs, batch.sampling_logprobs, m, first.offpolicy_cap) \
        if first.offpolicy_cap is not None else {}
    # partial rollouts: the canary on the tokens the current adapter sampled (the stale-weights rule)
    f = None if batch.versions is None else m & (batch.versions == version)
    fresh = {"rollout_trainer_k3_fresh": float(kl_penalty(batch.sampling_logprobs[f], first.logprobs[f]).mean())} \
        if f is not None and f.any() else {}
    return {"entropy": float(ent.mean()), "entropy_p10": float(torch.quantile(ent, 0.1)),
            "entropy_p90": float(torch.quantile(ent, 0.9)), **_entropy_by_advantage(batch, first, m),
            "rollout_trainer_k3": float(d.mean()), "rollout_trainer_maxdiff": float(diff.max()), **weights, **fresh}


def _entropy_by_advantage(batch, first, m) -> dict:
    """Token entropy of the samples better than their group's mean (`entropy_adv_pos`) and worse than it
    (`entropy_adv_neg`): a policy that learns grows confident where it is right; one that collapses is as sure
    of its failures (the monitor's entropy_collapse rule reads both). Absent when a side has no token."""
    adv = batch.advantages
    if adv is None:
        return {}
    row = adv if adv.dim() == 1 else (adv * m).sum(-1) / m.sum(-1).clamp(min=1)
    out = {}
    for name, side in (("entropy_adv_pos", row > 0), ("entropy_adv_neg", row < 0)):
        sel = m & side[:, None]
        if sel.any():
            out[name] = float(first.entropy[sel].mean())
    return out


def _agent_stats(batch) -> dict:
    """Multi-turn rollouts only: tool use per trajectory (absent for single-turn batches)."""
    info = getattr(batch, "trajectories", None)
    if not info or not any(info):
        return {}
    n = len(info)
    calls = sum(t.get("tool_calls", 0) for t in info)
    errors = sum(t.get("tool_errors", 0) for t in info)
    obs = float(batch.observation_mask.sum())
    real = float(batch.completion_mask.sum())
    out = {"tool_calls_per_traj": calls / n,
           "turns_mean": sum(t.get("turns", 0) for t in info) / n,
           "max_turns_frac": sum(bool(t.get("hit_max_turns")) for t in info) / n,
           "obs_token_frac": obs / real if real else 0.0}
    if calls:  # no call made: the error rate was not measured (left out, not 0)
        out["tool_error_rate"] = errors / calls
    return out


def samples_of(batch, step: int, k: int) -> list[dict]:
    """The first k rows of the batch as samples.jsonl rows (with the turn structure of agent rows)."""
    k = min(k, batch.num_rows)
    info = getattr(batch, "trajectories", None) or [None] * batch.num_rows
    out = []
    for i in range(k):
        r = float(batch.rewards[i])
        row = {"step": step, "prompt": batch.prompts[i], "completion": batch.completions[i],
               "reward": None if math.isnan(r) else r,
               **{f"reward/{n}": float(v[i]) for n, v in batch.reward_components.items()}}
        if info[i]:
            row["turns"] = info[i].get("turn_log", [])
        out.append(_clean(row))
    return out
