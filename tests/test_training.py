"""Training steps on a tiny random model: what changes, what must not, and failures survived."""

import json

import pytest
import torch

from tinyrl.api import build_trainer, train


def small(tiny_model_dir, run_root, **extra):
    o = {"model.name": tiny_model_dir, "log.run_dir": run_root, "log.progress": False,
         "train.steps": 2, "train.prompts_per_step": 4, "rollout.num_generations": 4,
         "train.micro_batch_size": 8, "rollout.max_new_tokens": 4, "data.num_train": 64,
         "data.num_eval": 8, "train.lr": 1e-2}
    o.update(extra)
    return o


def lora_and_base(model):
    lora = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    return lora, base


def reward_by_length(prompts, completions, **kw):
    """A dense reward so every group has non-zero advantages."""
    return [float(len(c)) for c in completions]


def test_step_changes_lora_and_never_the_base(tiny_model_dir, run_root):
    t = build_trainer(overrides=small(tiny_model_dir, run_root, **{
        "reward.functions": [f"{__name__}:reward_by_length"], "train.eval_before_after": False}))
    lora0, base0 = lora_and_base(t.model)
    assert all(not p.requires_grad for n, p in t.model.named_parameters() if "lora_" not in n)
    metrics, _ = t.train_step()
    lora1, base1 = lora_and_base(t.model)
    assert any(not torch.equal(lora0[n], lora1[n]) for n in lora0)
    assert all(torch.equal(base0[n], base1[n]) for n in base0)
    assert metrics["grad_norm"] > 0 and not metrics["skipped_nonfinite"]


@pytest.mark.parametrize("targets", [["lm_head"], ["q_proj", "lm_head"]])
def test_lora_on_lm_head_trains_and_the_rollout_samples_it(tiny_model_dir, run_root, targets):
    """The fused loss applies the head itself, so a LoRA on lm_head must be folded into its weight:
    otherwise the head's adapter gets no gradient (lm_head alone: nothing requires grad at all)."""
    t = build_trainer(overrides=small(tiny_model_dir, run_root, **{
        "lora.target_modules": targets, "reward.functions": [f"{__name__}:reward_by_length"],
        "train.eval_before_after": False, "train.lr": 3e-2}))
    head0 = {n: p.detach().clone() for n, p in t.model.named_parameters() if "lm_head.lora_" in n}
    assert head0
    t.train_step()
    second, _ = t.train_step()  # rollout from the updated head, scored by the trainer
    head1 = {n: p.detach() for n, p in t.model.named_parameters() if "lm_head.lora_" in n}
    assert all(not torch.equal(head0[n], head1[n]) for n in head0)
    assert second["rollout_trainer_maxdiff"] < 1e-4  # engine and trainer see the same trained head
    with torch.no_grad():  # and the reference (adapter disabled) is the untouched base head
        from tinyrl.model import lm_head_of, output_projection, reference_context

        with reference_context(t.model):
            w_ref, _ = output_projection(t.model)
        w_pol, _ = output_projection(t.model)
    assert torch.equal(w_ref, lm_head_of(t.model).base_layer.weight) and not torch.equal(w_ref, w_pol)


def test_qlora_4bit_step_on_cpu_trains_the_adapter(tiny_model_dir, run_root):
    t = build_trainer(overrides=small(tiny_model_dir, run_root, **{
        "model.load_in_4bit": True, "reward.functions": [f"{__name__}:reward_by_length"],
        "train.eval_before_after": False}))
    import bitsandbytes as bnb

    assert any(isinstance(m, bnb.nn.Linear4bit) for m in t.model.modules())
    lora0, _ = lora_and_base(t.model)
    t.train_step()
    lora1, _ = lora_and_base(t.model)
    assert any(not torch.equal(lora0[n], lora1[n]) for n in lora0)


def test_qlora_gradient_survives_a_no_grad_rollout(tiny_model_dir):
    """A rollout (eval mode, no grad) must not change how the 4-bit base trains afterwards.

    bitsandbytes on an AVX512-BF16 CPU repacks an eval-mode Linear4bit for a kernel with no
    backward on its first no-grad forward; tinyrl turns that off (model.keep_4bit_weights_trainable).
    On CPUs without AVX512-BF16 the repacking never happens and both twins agree anyway."""
    from tinyrl.config import config_from_dict
    from tinyrl.model import load_policy

    cfg = config_from_dict({"model": {"name": tiny_model_dir, "load_in_4bit": True}, "lora": {"r": 4, "alpha": 8}})
    ids = torch.tensor([[3, 12, 4, 13, 5, 6, 7, 8]])

    def lora_grads(rollout_first: bool):
        torch.manual_seed(0)
        model, _ = load_policy(cfg.model, cfg.lora)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.1)
        if rollout_first:
            model.eval()
            with torch.no_grad():
                model(ids)
            model.train()
        model(ids).logits.log_softmax(-1)[0, :, 1].sum().backward()
        return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    fresh, after = lora_grads(False), lora_grads(True)
    assert fresh.keys() == after.keys() and len(fresh) > 0
    for n in fresh:
        torch.testing.assert_close(after[n], fresh[n], rtol=1e-4, atol=1e-5, msg=n)


def crashing_reward(prompts, completions, **kw):
    raise ValueError("grader exploded")


def test_a_raising_reward_does_not_stop_the_run(tiny_model_dir, run_root):
    run = train(**small(tiny_model_dir, run_root, **{
        "reward.functions": [f"{__name__}:reward_by_length", f"{__name__}:crashing_reward"]}))
    assert len(run.metrics) == 2
    assert all(m["reward_failures"] == 16 for m in run.metrics)  # every sample, every step
    summary = json.loads((run.path / "summary.json").read_text())
    assert summary["reward_failures"]["crashing_reward"] == 32
    assert (run.path / "adapter" / "adapter_model.safetensors").exists()


def test_non_finite_step_is_skipped_and_reported(tiny_model_dir, run_root):
    t = build_trainer(overrides=small(tiny_model_dir, run_root, **{
        "reward.functions": [f"{__name__}:reward_by_length"], "train.eval_before_after": False}))
    advantages = t.advantages

    def infinite_advantage(batch):  # an inf reward is now a reward failure (excluded), so inject the inf here
        stats = advantages(batch)
        batch.advantages[0] = float("inf")
        return stats

    t.advantages = infinite_advantage
    lora0, _ = lora_and_base(t.model)
    metrics, _ = t.train_step()
    lora1, _ = lora_and_base(t.model)
    assert metrics["skipped_nonfinite"] and metrics["skipped_steps_total"] == 1
    assert all(torch.equal(lora0[n], lora1[n]) for n in lora0)  # weights untouched
    alarms = t.monitor.update(t.state.step, metrics)
    assert any(a.name == "gradient_explosion" and "skipped" in a.evidence for a in alarms)


def constant_reward(prompts, completions, **kw):
    """Every sample scores the same: every group has zero advantage, nothing to learn."""
    return [1.0] * len(completions)


def test_a_batch_without_signal_does_not_move_the_weights(tiny_model_dir, run_root):
    """All advantages 0 (and no KL term): AdamW's momentum and weight decay alone must not
    move the adapter, or a solved (or hopeless) batch drifts the policy."""
    from tinyrl.config import RewardSpec
    from tinyrl.rewards.core import RewardSet

    t = build_trainer(overrides=small(tiny_model_dir, run_root, **{
        "reward.functions": [f"{__name__}:reward_by_length"], "train.eval_before_after": False}))
    first, _ = t.train_step()  # a real step: the optimiser now has momentum
    assert not first["skipped_no_signal"] and first["update_kl"] > 0
    t.source.shaper.rewards = RewardSet([RewardSpec(f"{__name__}:constant_reward")])  # phase 2 rewards by it
    lora0, _ = lora_and_base(t.model)
    metrics, _ = t.train_step()
    lora1, _ = lora_and_base(t.model)
    assert metrics["skipped_no_signal"] and metrics["zero_std_frac"] == 1.0 and metrics["grad_norm"] == 0.0
    assert all(torch.equal(lora0[n], lora1[n]) for n in lora0)
    assert "update_kl" not in metrics and t.state.no_signal_steps == 1 and t.state.step == 2  # no update: nothing measured


def test_update_kl_is_measured_after_the_update(tiny_model_dir, run_root):
    """With one pass per batch the loss sees ratio 1 everywhere; the KL old->new and the
    update clip fraction come from re-scoring the batch after the step, so they measure the step."""
    def step(lr):
        t = build_trainer(overrides=small(tiny_model_dir, run_root, **{
            "reward.functions": [f"{__name__}:reward_by_length"], "train.eval_before_after": False,
            "train.lr": lr, "train.weight_decay": 0.0}))
        return t.train_step()[0]

    still, small_step, big_step = step(1e-12), step(1e-3), step(1e-1)
    assert still["update_kl"] == pytest.approx(0.0, abs=1e-9) and still["update_clip_frac"] == 0.0
    assert still["clip_frac"] == 0.0 and "pass_kl" not in still  # one pass: the loss sees no old policy
    assert 0 < small_step["update_kl"] < big_step["update_kl"]
    assert big_step["update_clip_frac"] > 0 and big_step["logp_pos_delta"] > 0


def test_run_folder_contents(tiny_model_dir, run_root):
    run = train(**small(tiny_model_dir, run_root, **{"reward.functions": ["task", f"{__name__}:reward_by_length"]}))
    files = {p.name for p in run.path.iterdir()}
    assert {"config.yaml", "metrics.jsonl", "samples.jsonl", "adapter", "checkpoints", "summary.json"} <= files
    lines = (run.path / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(x) for x in lines]
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("reward_mean", "reward_std", "reward/task", "loss", "entropy", "clip_frac", "completion_len",
                "grad_norm", "step_time", "tokens_per_s", "rollout_trainer_k3"):
        assert key in rows[0], key
    assert rows[0]["rollout_trainer_maxdiff"] < 1e-3  # the engine samples from the trained weights
    samples = [json.loads(x) for x in (run.path / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * 4 and {"prompt", "completion", "reward"} <= set(samples[0])
    assert run.eval_before is not None and run.eval_after is not None


def test_qlora_load_lets_go_of_the_weight_file(tiny_model_dir):
    """A 4-bit load keeps no view into the safetensors memory map (its unquantized embeddings and
    norms get memory of their own), so the file's pages stop counting as resident; tied weights
    stay one tensor. Linux: reads /proc/self/maps."""
    from pathlib import Path

    from tinyrl.config import ModelConfig
    from tinyrl.model import load_base_model, resolve_model

    if not Path("/proc/self/maps").exists():
        pytest.skip("reads /proc/self/maps (Linux)")
    model = load_base_model(ModelConfig(name=tiny_model_dir, load_in_4bit=True), resolve_model(tiny_model_dir))
    maps = [line.split() for line in Path("/proc/self/maps").read_text().splitlines()]
    spans = [tuple(int(x, 16) for x in m[0].split("-")) for m in maps
             if len(m) > 5 and m[5].startswith(str(Path(tiny_model_dir).resolve())) and m[5].endswith(".safetensors")]
    inside = [n for n, t in list(model.named_parameters()) + list(model.named_buffers())
              if any(a <= t.untyped_storage().data_ptr() < b for a, b in spans)]
    assert inside == []
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert tied == bool(model.config.tie_word_embeddings)
