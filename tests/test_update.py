"""The update does less work with the same gradient: zero-advantage rows get no forward/backward,
micro-batches are length-bucketed and cut to their own widths, the rows of one prompt read it once. Checked against the plainest
update there is: one forward of the whole padded batch through the model's own lm_head (full
logits), policy_loss, backward."""

from __future__ import annotations

import pytest
import torch

import tinyrl.model.forward as model_mod
from tinyrl.algo.losses import BatchTotals, policy_loss
from tinyrl.api import build_trainer
from tinyrl.model import common_prefix_length, trunk_of
from tinyrl.update import completion_hidden, micro_batches, policy_update, rows_to_compute


def reward_half_constant(prompts, completions, **kw):
    """Half the groups get one reward for every sample (zero advantage), the rest a dense one."""
    return [1.0 if int(p[0]) % 2 == 0 else float(len(c)) for p, c in zip(prompts, completions)]


def trainer(tiny_model_dir, run_root, **extra):
    o = {"model.name": tiny_model_dir, "log.run_dir": run_root, "log.progress": False, "train.steps": 2,
         "train.prompts_per_step": 6, "rollout.num_generations": 4, "train.micro_batch_size": 4,
         "rollout.max_new_tokens": 8, "data.num_train": 64, "data.num_eval": 0, "train.lr": 1e-2,
         "train.eval_before_after": False, "reward.functions": [f"{__name__}:reward_half_constant"]}
    o.update(extra)
    return build_trainer(overrides=o)


def plain_gradient(t, batch) -> tuple[float, dict]:
    """The reference: full batch, full logits, no skipping, no bucketing."""
    model, a = t.model, t.cfg.algo
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], 1)
    attn = torch.cat([batch.prompt_mask, batch.completion_mask], 1)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).logits
    P, T = batch.prompt_ids.shape[1], batch.completion_ids.shape[1]
    logp = torch.log_softmax(logits[:, P - 1: P + T - 1].float() / t.cfg.rollout.temperature, -1)
    logp = logp.gather(-1, batch.completion_ids[..., None]).squeeze(-1)
    mask = batch.loss_mask.float()
    totals = BatchTotals.of(mask, t.cfg.rollout.max_new_tokens)
    out = policy_loss(logp * mask, batch.old_logprobs, batch.advantages, mask, a, totals=totals,
                      ref_logp=batch.ref_logprobs)
    model.zero_grad()
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return float(out.loss), grads


def fast_gradient(t, batch):
    sd = {k: v.clone() for k, v in t.model.state_dict().items() if "lora_" in k}
    lr = t.optimizer.param_groups[0]["lr"]
    t.optimizer.param_groups[0]["lr"] = 0.0
    res = policy_update(t.model, t.optimizer, batch, t.cfg.algo, temperature=t.cfg.rollout.temperature,
                        micro_batch=t.cfg.train.micro_batch_size, max_grad_norm=1e9,
                        max_len=t.cfg.rollout.max_new_tokens)
    t.optimizer.param_groups[0]["lr"] = lr
    grads = {n: p.grad.clone() for n, p in t.model.named_parameters() if p.grad is not None}
    t.model.load_state_dict(sd, strict=False)
    return res, grads


@pytest.mark.parametrize("extra", [
    {},
    {"algo.dynamic_sampling": True},
    {"algo.beta": 0.1},
    {"algo.recipe": "dr_grpo"},
], ids=["plain", "dynamic_sampling", "kl", "dr_grpo"])
def test_skip_and_buckets_give_the_plain_gradient(tiny_model_dir, run_root, extra):
    t = trainer(tiny_model_dir, run_root, **extra)
    t.train_step()  # off the initial point: the adapter is not zero, so the KL term acts
    batch, _ = t.collect_batch()
    t.reference(batch)
    t.advantages(batch)
    res, fast = fast_gradient(t, batch)
    loss, plain = plain_gradient(t, batch)
    assert res.stats["loss"] == pytest.approx(loss, rel=1e-5, abs=1e-7)
    assert fast.keys() == plain.keys()
    for n in plain:
        assert torch.allclose(fast[n], plain[n], rtol=1e-4, atol=1e-7), n
    zero = ~((batch.advantages != 0).any(-1) if batch.advantages.dim() == 2 else batch.advantages != 0)
    if "algo.beta" in extra or extra.get("algo.dynamic_sampling"):
        assert res.rows.numel() == batch.num_rows - (0 if "algo.beta" in extra else int(zero.sum()))
    else:
        assert zero.any() and res.rows.numel() == batch.num_rows - int(zero.sum())  # rows really were skipped


def test_zero_advantage_rows_get_no_backward_but_keep_their_entropy(tiny_model_dir, run_root):
    t = trainer(tiny_model_dir, run_root)
    batch, _ = t.collect_batch()
    t.advantages(batch)
    rows = rows_to_compute(batch, t.cfg.algo)
    assert 0 < rows.numel() < batch.num_rows
    res, _ = fast_gradient(t, batch)
    m = batch.loss_mask.bool()
    assert (res.entropy[m] > 0).all()  # every loss token scored, trained or not
    ref = t._score(batch)
    assert torch.allclose(res.logprobs[m], ref.logprobs[m], atol=1e-5)


def test_micro_batches_are_cut_to_their_own_widths():
    from types import SimpleNamespace

    pm = torch.tensor([[0, 0, 1], [1, 1, 1], [0, 1, 1], [0, 0, 1]])
    cm = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    b = SimpleNamespace(prompt_mask=pm, completion_mask=cm, prompt_ids=pm)
    mbs = micro_batches(b, torch.arange(4), 2)
    assert [mb.rows.tolist() for mb in mbs] == [[1, 2], [0, 3]]  # longest first, similar lengths together
    assert [(mb.prompt_start, mb.completion_end) for mb in mbs] == [(0, 4), (2, 1)]


def with_preamble(batch, preamble: list[int]):
    """The batch with `preamble` before every prompt (left padding redone), as a chat template's
    system prompt opens every prompt of a real batch."""
    real = [batch.prompt_ids[i][batch.prompt_mask[i].bool()].tolist() for i in range(batch.num_rows)]
    width = len(preamble) + max(map(len, real))
    ids, mask = torch.zeros(batch.num_rows, width, dtype=torch.long), torch.zeros(batch.num_rows, width, dtype=torch.long)
    for i, r in enumerate(real):
        ids[i, width - len(preamble) - len(r):] = torch.tensor(preamble + r)
        mask[i, width - len(preamble) - len(r):] = 1
    batch.prompt_ids, batch.prompt_mask = ids, mask.to(batch.prompt_mask.dtype)
    return batch


@pytest.mark.parametrize("checkpointing, pack, attn, preamble",
                         [(False, False, "sdpa", 0), (False, True, "sdpa", 0), (False, True, "eager", 0),
                          (True, None, "sdpa", 0), (False, False, "sdpa", 20), (False, True, "sdpa", 20),
                          (False, True, "eager", 20)],
                         ids=["shared", "shared-packed", "shared-packed-eager", "checkpointed", "prefix",
                              "prefix-packed", "prefix-packed-eager"])
def test_rows_of_one_prompt_read_it_once_with_the_full_rows_gradient(tiny_model_dir, run_root, monkeypatch,
                                                                    checkpointing, pack, attn, preamble):
    """A group's rows share their prompt's KV cache (its graph kept): the hidden states and the
    gradients of every full row, for a G-th of the prompt tokens; packed, for only the rows' real
    tokens (no padding; sdpa takes the block mask as booleans, eager as an additive float mask).
    Prompts that open alike (a 20-token preamble) read that common prefix once for all of them.
    Gradient checkpointing drops a training forward's cache, so there every row runs in full (same
    result)."""
    t = trainer(tiny_model_dir, run_root, **{"model.gradient_checkpointing": checkpointing})
    t.model.set_attn_implementation(attn)
    t.train_step()  # a non-zero adapter: the prompt positions' K/V depend on it
    batch, _ = t.collect_batch()
    if preamble:
        batch = with_preamble(batch, [3 + i % 10 for i in range(preamble)])
        monkeypatch.setattr(model_mod, "MIN_SHARED_PREFIX", 1)  # the mechanism, at any size (the rule: below)
    trunk = trunk_of(t.model)
    assert trunk.config._attn_implementation == attn
    mb = micro_batches(batch, torch.arange(batch.num_rows), batch.num_rows)[0]  # every prompt G times
    P, t1 = batch.prompt_ids.shape[1] - mb.prompt_start, mb.completion_end
    mask = batch.completion_mask[:, :t1].float()
    w = torch.randn(*mask.shape, trunk.config.hidden_size, generator=torch.Generator().manual_seed(0))
    tokens = []
    hook = trunk.register_forward_pre_hook(lambda m, a, kw: tokens.append(kw["input_ids"].numel()), with_kwargs=True)
    t.model.train()
    t.model.zero_grad()  # the step above leaves its gradients
    h = completion_hidden(t.model, batch, mb, pack=pack)  # rows in the micro-batch's order
    (h * w[mb.rows] * mask[mb.rows, :, None]).sum().backward()
    hook.remove()
    shared = {n: p.grad.clone() for n, p in t.model.named_parameters() if p.grad is not None}
    t.model.zero_grad()

    def full_rows(rows):  # every row in full, `rows` in this order: hidden states, gradients
        ids = torch.cat([batch.prompt_ids[rows, mb.prompt_start:], batch.completion_ids[rows, :t1]], 1)
        attn = torch.cat([batch.prompt_mask[rows, mb.prompt_start:], batch.completion_mask[rows, :t1]], 1)
        full = trunk(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
                     use_cache=False).last_hidden_state[:, P - 1: P + t1 - 1]
        (full * w[rows] * mask[rows, :, None]).sum().backward()
        grads = {n: p.grad.clone() for n, p in t.model.named_parameters() if p.grad is not None}
        t.model.zero_grad()
        return full, grads

    full, plain = full_rows(mb.rows)
    _, reordered = full_rows(mb.rows.flip(0))  # fp32's own noise: the same sums in another order
    m = mask[mb.rows].bool()
    assert torch.allclose(h[m], full[m], atol=1e-5)
    assert shared.keys() == plain.keys() and len(plain) > 0
    for n in plain:
        noise = (reordered[n] - plain[n]).norm()
        assert (shared[n] - plain[n]).norm() <= 2 * noise + 1e-6 * plain[n].norm(), n
    n_rows, n_prompts = batch.num_rows, len({tuple(r) for r in batch.prompt_ids.tolist()})
    real = int(batch.completion_mask[:, :t1].sum())
    if checkpointing:
        assert tokens == [n_rows * (P + t1)]
    else:  # each distinct prompt but its last token once, then each row's last prompt token and completion
        c = common_prefix_length(batch.prompt_ids[:, mb.prompt_start:-1], batch.prompt_mask[:, mb.prompt_start:-1])
        distinct = torch.unique(torch.cat([batch.prompt_ids, batch.prompt_mask], 1), dim=0)
        prompt_real = int(distinct[:, batch.prompt_ids.shape[1]:].sum()) - n_prompts  # real tokens, all but the last
        if pack:  # one pass: the common prefix once, each prompt's rest, each row's real tokens, no padding
            assert tokens == [prompt_real - (n_prompts - 1) * c + real]
        elif preamble:  # the common prefix once, then each distinct prompt's rest, then the padded rows
            assert c >= preamble and tokens == [c, n_prompts * (P - 1 - c), n_rows * t1]
        else:
            assert c * (n_prompts - 1) < model_mod.MIN_SHARED_PREFIX and tokens == [n_prompts * (P - 1), n_rows * t1]
        assert n_prompts < n_rows and real < n_rows * t1  # there was padding to leave out


def test_rows_are_packed_where_the_padding_costs_more_than_the_block_mask():
    from types import SimpleNamespace

    from tinyrl.update import _packing_pays

    smol = SimpleNamespace(hidden_size=576, intermediate_size=1536)  # SmolLM2-135M
    two = torch.tensor([51, 50])  # 2 distinct prompts' cached tokens
    # a group of mostly short completions and one long one: the padding is most of the work
    assert _packing_pays(smol, torch.tensor([28, 12, 10, 9, 8, 8, 6, 5]), two)
    # equal lengths: nothing to remove, and the packed attention is larger
    assert not _packing_pays(smol, torch.tensor([28] * 8), two)
    # many long rows of a small model: the packed attention (quadratic in all the rows' tokens) costs more
    tiny = SimpleNamespace(hidden_size=64, intermediate_size=128)
    assert not _packing_pays(tiny, torch.tensor([128] * 15 + [100]), torch.tensor([30] * 4))


def test_scoring_with_merged_lora_matches_peft_forward(tiny_model_dir, run_root, monkeypatch):
    """No-grad scoring runs each LoRA linear as one matmul over W + dW: the logprobs and entropies
    of peft's own forward (to fp32 rounding), for a non-zero adapter; the reference is the base."""
    import contextlib

    import tinyrl.update as update

    t = trainer(tiny_model_dir, run_root)
    with torch.no_grad():
        for n, p in t.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.2)
    batch, _ = t.collect_batch()
    merged, ref = t._score(batch), t._score(batch, reference=True)
    monkeypatch.setattr(update, "merged_lora_linears", lambda m: contextlib.nullcontext(0))
    plain = t._score(batch)
    m = batch.action_mask.bool()
    assert torch.allclose(merged.logprobs[m], plain.logprobs[m], atol=1e-5)
    assert torch.allclose(merged.entropy[m], plain.entropy[m], atol=1e-5)
    assert not torch.allclose(merged.logprobs[m], ref.logprobs[m], atol=1e-3)  # the adapter really acts
