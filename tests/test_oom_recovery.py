"""Group-safe out-of-memory recovery (issue 18): an OOM in the update halves the micro-batch and
redoes the step from the same batch (the same adapter as a run that never hit one); an OOM in the
rollout samples again with fewer prompts per engine call. The OOM is injected (no GPU here)."""

from __future__ import annotations

import torch

import tinyrl.update as upd
from tinyrl.api import build_trainer


def small(model, run_root, name, **extra):
    o = {"model.name": model, "log.run_dir": run_root, "log.name": name, "log.progress": False, "train.steps": 3,
         "train.prompts_per_step": 4, "rollout.num_generations": 4, "train.micro_batch_size": 16,
         "rollout.max_new_tokens": 6, "data.num_train": 64, "data.num_eval": 0, "train.lr": 1e-2,
         "train.eval_before_after": False, "reward.functions": ["tests.test_training:reward_by_length"]}
    o.update(extra)
    return o


def lora(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def test_update_oom_halves_the_micro_batch_and_gives_the_same_adapter(tiny_model_dir, run_root, monkeypatch):
    plain = build_trainer(overrides=small(tiny_model_dir, run_root, "plain", **{"train.micro_batch_size": 4}))
    plain.train()
    real = upd.kernels.fused_linear_grpo_loss

    def tight_memory(hidden, *a, **kw):  # "a card" that holds 4 rows per micro-batch
        if hidden.shape[0] > 4:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real(hidden, *a, **kw)

    monkeypatch.setattr(upd.kernels, "fused_linear_grpo_loss", tight_memory)
    t = build_trainer(overrides=small(tiny_model_dir, run_root, "oom"))
    run = t.train()
    assert t.state.micro_batch == 4 and t.state.oom_retries == 2  # 16 -> 8 -> 4, once
    assert [m["micro_batch_now"] for m in run.metrics] == [4, 4, 4]
    a, b = lora(plain.model), lora(t.model)
    assert all(torch.allclose(a[n], b[n], atol=1e-6) for n in a)


def test_rollout_oom_samples_again_with_fewer_prompts(tiny_model_dir, run_root, monkeypatch):
    t = build_trainer(overrides=small(tiny_model_dir, run_root, "roll"))
    real = t.engine.generate

    def tight(prompts, n, params, columns=None, greedy=False):
        if len(prompts) * n > 8:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real(prompts, n, params, columns, greedy)

    t.engine.generate = tight
    metrics, _ = t.train_step()
    assert t.state.rollout_prompts == 2 and metrics["oom_retries_total"] == 1
    batch, _ = t.collect_batch()
    assert batch.num_rows == 16 and batch.group.tolist() == [g for g in range(4) for _ in range(4)]
