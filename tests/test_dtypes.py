"""`model.dtype: auto` per card (bf16 from sm_80, fp16 on a T4, fp32 on a CPU), and fp16 training kept
safe: fp32 LoRA weights and a dynamic loss scale that leaves the update unchanged."""

import logging

import pytest
import torch

from tests.test_training import small
from tinyrl.api import build_trainer
from tinyrl.config import decide_dtype, load_config
from tinyrl.hardware import compute_dtype
from tinyrl.model import load_policy
from tinyrl.planner.plan import dtype_bytes
from tinyrl.update import LOSS_SCALE, initial_loss_scale, next_loss_scale, policy_update

CARDS = {75: "float16", 80: "bfloat16", 86: "bfloat16", 89: "bfloat16", 90: "bfloat16", None: "float32"}


@pytest.mark.parametrize("capability", list(CARDS))
def test_auto_dtype_per_card_is_decided_and_logged_once(capability, caplog):
    _, cfg = load_config("tiny_grpo_cpu")
    assert cfg.model.dtype == "auto"
    with caplog.at_level(logging.INFO, logger="tinyrl.config"):
        decided = decide_dtype(cfg, capability)
    assert decided.model.dtype == CARDS[capability] == compute_dtype(capability)
    assert caplog.text.count("model.dtype auto ->") == 1
    assert decide_dtype(decided, capability) is decided  # an explicit dtype is kept as given
    assert initial_loss_scale(decided) == (LOSS_SCALE["initial"] if capability == 75 else 1.0)


def test_the_planner_counts_auto_as_the_device_decides():
    assert dtype_bytes("auto", "cpu") == 4 and dtype_bytes("auto", "cuda") == 2 == dtype_bytes("float16", "cpu")


def test_an_fp16_base_trains_fp32_lora_weights():
    _, cfg = load_config("tiny_grpo_cpu", {"model.dtype": "float16"})
    model, _ = load_policy(cfg.model, cfg.lora)
    lora = [p for n, p in model.named_parameters() if p.requires_grad]
    assert lora and all(p.dtype == torch.float32 for p in lora)  # the optimizer's master weights
    assert all(p.dtype == torch.float16 for n, p in model.named_parameters() if not p.requires_grad)


def _one_update(loss_scale, tiny_model_dir, run_root):
    t = build_trainer(overrides=small(tiny_model_dir, run_root, **{
        "reward.functions": ["tests.test_training:reward_by_length"], "train.eval_before_after": False}))
    t.run.unlock()
    batch, _ = t.collect_batch()
    t.advantages(batch)
    cfg = t.cfg
    result = policy_update(t.model, t.optimizer, batch, cfg.algo, temperature=cfg.rollout.temperature,
                           micro_batch=4, max_grad_norm=1e9, max_len=cfg.rollout.max_new_tokens, loss_scale=loss_scale)
    return result, {n: p.detach().clone() for n, p in t.model.named_parameters() if p.requires_grad}


def test_a_loss_scale_leaves_the_update_as_it_was(tiny_model_dir, run_root):
    plain, w1 = _one_update(1.0, tiny_model_dir, run_root)
    scaled, w2 = _one_update(1024.0, tiny_model_dir, run_root)  # a power of two: scaling is exact
    assert not scaled.skipped and not scaled.overflow and scaled.grad_norm == pytest.approx(plain.grad_norm, rel=1e-5)
    assert all(torch.allclose(w1[n], w2[n], rtol=0, atol=1e-7) for n in w1)
    over, w3 = _one_update(1e38, tiny_model_dir, run_root)  # the scaled loss overflows fp32
    assert over.skipped and over.overflow
    assert next_loss_scale(1e38, 7, over) == (5e37, 0)


def _qlora_loss_and_grads(tiny_model_dir, prepare):
    """The tiny model in 4-bit with a bfloat16 compute dtype: (embedding dtype, loss, LoRA grads)."""
    from peft import LoraConfig, get_peft_model

    from tinyrl.model import load_base_model, resolve_model

    _, cfg = load_config("tiny_grpo_cpu", {"model.name": tiny_model_dir, "model.load_in_4bit": True,
                                           "model.dtype": "bfloat16"})
    base = prepare(load_base_model(cfg.model, resolve_model(tiny_model_dir)))
    torch.manual_seed(0)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    for n, p in model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.02)  # B = 0 would make every A gradient 0
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12], [6, 7, 8, 9, 10, 11, 12, 13]])
    loss = model(input_ids=ids, labels=ids).loss.float()
    loss.backward()
    grads = {n: p.grad.float() for n, p in model.named_parameters() if p.requires_grad}
    return model.get_input_embeddings().weight.dtype, float(loss.detach()), grads


def test_qlora_keeps_embeddings_16_bit_with_the_same_loss_and_gradients(tiny_model_dir):
    from peft import prepare_model_for_kbit_training

    from tinyrl.model.load import prepare_for_training

    emb, loss, grads = _qlora_loss_and_grads(tiny_model_dir, lambda m: prepare_for_training(m, False))
    emb_peft, loss_peft, grads_peft = _qlora_loss_and_grads(
        tiny_model_dir, lambda m: prepare_model_for_kbit_training(m, use_gradient_checkpointing=False))
    assert emb == torch.bfloat16 and emb_peft == torch.float32  # half the bytes of the frozen embeddings
    assert loss == pytest.approx(loss_peft, rel=1e-2)  # bf16 rounding of the frozen weights, nothing else
    assert grads.keys() == grads_peft.keys()
    for n in grads:
        assert grads[n].dtype == torch.float32
        rel = float((grads[n] - grads_peft[n]).norm() / grads_peft[n].norm())
        assert rel < 0.03, (n, rel)  # each adapter's gradient: the same direction and size, to bf16 rounding
